"""The iceberg integration: the Apache Iceberg table sink kind, registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factory imports the adapter (and
pyiceberg) when a run builds one.
"""

from __future__ import annotations

from airflow_eo.core.sinks import SinkCapabilities, register_sink
from airflow_eo.iceberg.specs import IcebergTableSink, build

register_sink(IcebergTableSink, SinkCapabilities(accumulates=True, appends=True, interval_replay=True,
                                                  table_commits=True), build)
