"""The iceberg integration: the Apache Iceberg table sink kind, registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factory imports the adapter (and
pyiceberg) when a run builds one.
"""

from __future__ import annotations

from airflow_eo.core.drivers import Driver, register_driver
from airflow_eo.core.sink_kinds import register_sink
from airflow_eo.iceberg.specs import IcebergTableSink, build
from airflow_eo.lakehouse.specs import table_commit_capabilities

# The library that reads the table's snapshots on the Airflow worker, without Spark (the ``iceberg`` extra).
register_driver(Driver("iceberg", "Apache Iceberg", "pyiceberg", ("exceptions.ValidationError",), extra="iceberg"))
register_sink(IcebergTableSink, table_commit_capabilities("iceberg"), build)
