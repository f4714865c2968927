"""Topic helpers of the examples, the demo and the tests: create a topic, read one whole."""

from __future__ import annotations

import uuid
from functools import cached_property
from typing import NamedTuple

from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook
from confluent_kafka.admin import AdminClient


class _BootstrapAdminHook(KafkaAdminClientHook):
    """The provider's admin hook on a bootstrap string instead of a ``kafka`` connection.

    :func:`ensure_topic` takes a bootstrap string, not a connection id (the demo, the benchmark,
    the tests and the example DAGs pass one); ``KafkaAdminClientHook.create_topic`` takes its
    admin client from the public ``get_conn``, so only that is replaced.
    """

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.bootstrap = bootstrap

    # KafkaBaseHook already turns BaseHook's get_conn method into a cached_property, and
    # create_topic reads it as one; mypy checks this override against BaseHook's method.
    @cached_property
    def get_conn(self) -> AdminClient:  # type: ignore[override]
        return AdminClient({"bootstrap.servers": self.bootstrap})


def ensure_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    """Create ``topic`` with ``partitions`` partitions (replication factor 1) unless it exists.

    Idempotent, and safe against a concurrent creator: ``KafkaAdminClientHook.create_topic``
    logs ``TOPIC_ALREADY_EXISTS`` instead of raising it.
    """
    hook = _BootstrapAdminHook(bootstrap)
    if topic not in hook.get_conn.list_topics(timeout=10).topics:
        hook.create_topic([(topic, partitions, 1)])


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
