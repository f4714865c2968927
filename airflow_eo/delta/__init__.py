"""The delta integration: the Delta Lake table sink kind, registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factory imports the adapter (and Delta's
libraries) when a run builds one.
"""

from __future__ import annotations

from airflow_eo.core.drivers import Driver, register_driver
from airflow_eo.core.sink_kinds import register_sink
from airflow_eo.delta.specs import DeltaTableSink, build
from airflow_eo.lakehouse.specs import table_commit_capabilities

# The library that reads the table's log on the Airflow worker, without Spark (the ``delta`` extra).
register_driver(Driver("delta", "Delta Lake", "deltalake", ("exceptions.DeltaError",), extra="delta"))
register_sink(DeltaTableSink, table_commit_capabilities("delta"), build)
