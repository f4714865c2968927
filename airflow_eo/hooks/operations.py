"""Airflow connections → :class:`~airflow_eo.ops.service.PipelineOperations` (what ``airflow eo`` runs)."""

from __future__ import annotations

import getpass
import socket
from typing import Any

from airflow_eo import CONFIG_SECTION
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.protocol import Sink
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import EoMySqlHook, OffsetStoreHook
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.mysql.store import MySqlOffsetStore
from airflow_eo.ops.service import PipelineOperations
from airflow_eo.sinks import KafkaTransactionalSink, spec_from_record


class AirflowConnections:
    """The store, the source cluster and the sinks through Airflow connections, as the operator finds them.

    :param offset_store_conn_id: ``mysql`` connection of the offset store.
    :param kafka_conn_id: ``kafka`` connection of the source cluster.
    :param mysql_conn_id: ``mysql`` connection of a MySQL sink's database (XA branches, dead letters); None:
        the connection the pipeline's sink declared (recorded in the store), else ``mysql_default``.
    """

    def __init__(self, offset_store_conn_id: str = "eo_offset_store", kafka_conn_id: str = "kafka_default",
                 mysql_conn_id: str | None = None) -> None:
        self.offset_store_conn_id = offset_store_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.mysql_conn_id = mysql_conn_id

    def store(self) -> MySqlOffsetStore:
        return OffsetStoreHook(self.offset_store_conn_id).get_store()

    def offset_source(self) -> KafkaOffsetSource:
        return KafkaClusterHook(self.kafka_conn_id).get_offset_source()

    def sink(self, pipeline_id: str, record: SinkRecord) -> Sink:
        # A Kafka sink keeps its own (recorded) connection; a MySQL sink's may be named on the command line.
        conn_id = None if record.kind == KafkaTransactionalSink.__name__ else self.mysql_conn_id
        return spec_from_record(record, conn_id).adapter(pipeline_id)

    def sink_database(self, record: SinkRecord | None) -> dict[str, Any]:
        recorded = record.conn_id if record is not None and record.kind != KafkaTransactionalSink.__name__ else None
        return EoMySqlHook(self.mysql_conn_id or recorded or "mysql_default").get_connect_kwargs()


def local_actor() -> str:
    """Who runs a command on this machine (``user@host``), for the audit log."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def pipeline_operations(offset_store_conn_id: str | None = None, kafka_conn_id: str | None = None,
                        mysql_conn_id: str | None = None, actor: str | None = None) -> PipelineOperations:
    """Operations over Airflow connections (what ``airflow eo`` and the UI tab run).

    :param offset_store_conn_id: ``mysql`` connection of the offset store (None: ``[eo] offset_store_conn_id``,
        else ``eo_offset_store``, the operator's default).
    :param kafka_conn_id: ``kafka`` connection of the source cluster (None: ``[eo] kafka_conn_id``, else
        ``kafka_default``).
    :param mysql_conn_id: ``mysql`` connection of a MySQL sink (None: the recorded one, else ``mysql_default``).
    :param actor: who runs them (default: the OS user and host).
    """
    from airflow.configuration import conf

    store = offset_store_conn_id or conf.get(CONFIG_SECTION, "offset_store_conn_id", fallback="eo_offset_store")
    kafka = kafka_conn_id or conf.get(CONFIG_SECTION, "kafka_conn_id", fallback="kafka_default")
    return PipelineOperations(AirflowConnections(store, kafka, mysql_conn_id), actor or local_actor())
