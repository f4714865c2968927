"""The sink specs a DAG declares (validated when the DAG is parsed, no I/O until run time).

Each kind lives in its integration's folder and registers itself there once (``airflow_eo.core.sink_kinds``:
spec, capabilities, factory); this module gathers them under their public names. Importing it registers every
built-in kind.
"""

from __future__ import annotations

import airflow_eo.integrations  # noqa: F401  (registers every built-in kind)
from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.sink_kinds import (
    SinkAsset,
    SinkKind,
    SinkSpec,
    sink_kind,
    sink_kinds,
    spec_from_record,
)
from airflow_eo.delta.specs import DeltaTableSink
from airflow_eo.iceberg.specs import IcebergTableSink
from airflow_eo.kafka.specs import KafkaTransactionalSink
from airflow_eo.mysql.specs import MySqlUpsertSink, MySqlXaSink
from airflow_eo.postgres.specs import PostgresTwoPhaseSink, PostgresUpsertSink

#: The registered sink kinds by name (what the offset store records): the spec classes.
SINK_KINDS = {name: kind.spec for name, kind in sink_kinds().items()}

__all__ = [
    "SINK_KINDS",
    "DeltaTableSink",
    "IcebergTableSink",
    "KafkaTransactionalSink",
    "MySqlUpsertSink",
    "MySqlXaSink",
    "PostgresTwoPhaseSink",
    "PostgresUpsertSink",
    "SinkAsset",
    "SinkCapabilities",
    "SinkKind",
    "SinkSpec",
    "sink_kind",
    "sink_kinds",
    "spec_from_record",
]
