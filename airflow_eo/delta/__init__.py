"""The delta integration: the Delta Lake table sink kind, registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factory imports the adapter (and Delta's
libraries) when a run builds one.
"""

from __future__ import annotations

from airflow_eo.core.sinks import SinkCapabilities, register_sink
from airflow_eo.delta.specs import DeltaTableSink, build

register_sink(DeltaTableSink, SinkCapabilities(accumulates=True, appends=True, interval_replay=True,
                                                table_commits=True), build)
