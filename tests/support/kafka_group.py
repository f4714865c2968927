"""Kafka-sink adapters built through the registry, and where a Kafka-sink pipeline's consumer group stands."""

from __future__ import annotations

from typing import Any

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.sink_kinds import sink_kind
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.kafka.sink import KafkaTransactionalAdapter
from airflow_eo.sinks import KafkaTransactionalSink


class BootstrapConnections:
    """Every ``kafka`` connection points at one bootstrap address (no Airflow connection needed)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def connection(self, conn_id: str) -> ConnectionInfo:
        raise LookupError(f"only Kafka connections here, not {conn_id!r}")

    def kafka_config(self, conn_id: str) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap}


def kafka_adapter(bootstrap: str, pipeline_id: str, spec: KafkaTransactionalSink) -> KafkaTransactionalAdapter:
    """The adapter the operator would build for ``spec`` (the registered factory, as ``build_sink`` calls it)."""
    adapter = sink_kind(spec.kind).build(spec, pipeline_id, BootstrapConnections(bootstrap), None)
    assert isinstance(adapter, KafkaTransactionalAdapter)
    return adapter


def group_positions(bootstrap: str, pipeline_id: str, source: str) -> dict[tuple[str, int], int]:
    """The group's position on each partition of ``source``.

    The group moves only inside a batch's transaction, and only on the partitions the batch read records
    from; a partition the pipeline never read a record from has no group offset and stands at its log
    start (where the store also has it, when nothing was deleted since the pipeline's first batch).
    """
    offsets = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    partitions = offsets.partitions([source])
    adapter = kafka_adapter(bootstrap, pipeline_id, KafkaTransactionalSink(topic="unused"))
    return {**offsets.earliest(partitions), **adapter.group_offsets((tp.topic, tp.partition) for tp in partitions)}
