"""Read a topic whole, independent of Spark and of airflow_eo's pipelines: what the ground truths use."""

from __future__ import annotations

import uuid
from typing import NamedTuple

from confluent_kafka.admin import AdminClient

from airflow_eo.examples.topics import ensure_topic  # noqa: F401 (re-exported)


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Delete ``topics`` and wait until the controller took each deletion (a tool's topics at its end)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until its futures end
    for future in (admin.delete_topics(topics, operation_timeout=60).values() if topics else []):
        future.result()


class TopicRecord(NamedTuple):
    partition: int
    offset: int
    timestamp_ms: int  # the record's Kafka timestamp (producer's CreateTime or broker's LogAppendTime)
    key: bytes | None
    value: bytes | None  # None: a record without a value (a tombstone)


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed"
               ) -> tuple[list[tuple[bytes | None, bytes | None]], dict[int, int]]:
    """Every record of the topic as (key, value), and the end offset of each partition (see :func:`read_records`)."""
    records, ends = read_records(bootstrap, topic, isolation)
    return [(r.key, r.value) for r in records], ends


def read_records(bootstrap: str, topic: str, isolation: str = "read_committed"
                 ) -> tuple[list[TopicRecord], dict[int, int]]:
    """Every record of the topic, and the end offset of each partition.

    Read with a plain consumer (``isolation``: read_committed or read_uncommitted),
    independent of Spark and of airflow_eo's pipelines: this is what ground truths use.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    partitions = sorted(AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
                        .topics[topic].partitions)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    records: list[TopicRecord] = []
    done: set[int | None] = {p for p, end in ends.items() if end == 0}
    try:
        while len(done) < len(partitions):
            msg = consumer.poll(10)
            if msg is None:
                raise TimeoutError(f"reading {topic} timed out")
            if msg.error():
                done.add(msg.partition())
                continue
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None, "a record that is no error event has both"
            records.append(TopicRecord(partition, offset, msg.timestamp()[1], msg.key(), msg.value()))
    finally:
        consumer.close()
    return records, ends


def not_null(data: bytes | None) -> bytes:
    """A record's key or value that the topic's producer always sets (the examples' ground truths).

    :param data: a key or value as :func:`read_topic` returns it.
    """
    assert data is not None, "a null key or value where the producer always writes one"
    return data
