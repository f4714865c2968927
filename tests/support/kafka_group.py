"""Where a Kafka-sink pipeline's consumer group stands, for comparing it with the offset store."""

from __future__ import annotations

from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.kafka.sink import KafkaTransactionalAdapter
from airflow_eo.sinks import KafkaTransactionalSink


def group_positions(bootstrap: str, pipeline_id: str, source: str) -> dict[tuple[str, int], int]:
    """The group's position on each partition of ``source``.

    The group moves only inside a batch's transaction, and only on the partitions the batch read records
    from; a partition the pipeline never read a record from has no group offset and stands at its log
    start (where the store also has it, when nothing was deleted since the pipeline's first batch).
    """
    offsets = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    partitions = offsets.partitions([source])
    adapter = KafkaTransactionalAdapter(KafkaTransactionalSink(topic="unused"), {"bootstrap.servers": bootstrap},
                                        pipeline_id)
    return {**offsets.earliest(partitions), **adapter.group_offsets((tp.topic, tp.partition) for tp in partitions)}
