"""Airflow connections → sink adapters and Assets, through the sink registry (``airflow_eo.core.sink_kinds``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.lineage_names import LineageDataset
from airflow_eo.core.protocol import Sink
from airflow_eo.core.sink_kinds import SinkAsset, SinkSpec, sink_kind
from airflow_eo.hooks.kafka import KafkaClusterHook


class AirflowConnectionResolver:
    """The registry's :class:`~airflow_eo.core.sink_kinds.Connections` role over Airflow connections (the secrets
    backend, ``AIRFLOW_CONN_*`` variables, the metadata database), as every hook reads them."""

    def connection(self, conn_id: str) -> ConnectionInfo:
        conn = BaseHook.get_connection(conn_id)
        return ConnectionInfo(conn_id=conn_id, conn_type=conn.conn_type, host=conn.host, port=conn.port,
                              login=conn.login, password=conn.password, schema=conn.schema, extra=conn.extra_dejson)

    def kafka_config(self, conn_id: str) -> dict[str, Any]:
        return KafkaClusterHook(conn_id).get_config()


def build_sink(spec: SinkSpec, pipeline_id: str, offset_store_conn_id: str | None = None) -> Sink:
    """The run-time adapter of ``spec`` for ``pipeline_id``, connected through Airflow connections.

    :param spec: the sink spec a DAG declared.
    :param pipeline_id: the pipeline.
    :param offset_store_conn_id: the pipeline's offset store, for sinks whose writes are fenced by its epochs.
    """
    return sink_kind(spec.kind).build(spec, pipeline_id, AirflowConnectionResolver(), offset_store_conn_id)


def sink_lineage(spec: SinkSpec) -> LineageDataset:
    """The output of ``spec`` in OpenLineage's dataset naming."""
    return spec.lineage(AirflowConnectionResolver())


def sink_asset(spec: SinkSpec) -> SinkAsset:
    """The Asset of ``spec`` (URI in the scheme of Airflow's provider for that system)."""
    return spec.asset(AirflowConnectionResolver())
