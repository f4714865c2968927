"""The offset source's reads of a real broker (``kafka/offsets.py``): what planning asks, and only that."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.kafka.offsets import KafkaOffsetSource
from tests.support.kafka import create_topic


class NoClusterMetadata:
    """The source's admin client, refusing the whole cluster's metadata (``list_topics`` of every topic)."""

    def __init__(self, inner: AdminClient) -> None:
        self._inner = inner

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the whole cluster's metadata was asked for")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_the_partitions_of_a_pipelines_topics_are_read_from_those_topics_metadata_only(bootstrap, topic_name):
    """Planning's metadata grew with the cluster's topics (all of them, for every batch); it asks for the pipeline's
    now. A missing topic is still named as one, with the broker it is missing from."""
    create_topic(bootstrap, topic_name, 3)
    other = create_topic(bootstrap, f"{topic_name}_two", 2)
    source = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    source._admin = NoClusterMetadata(source._admin)
    found = source.partitions([topic_name, other])
    assert [(tp.topic, tp.partition) for tp in found] == [(topic_name, 0), (topic_name, 1), (topic_name, 2),
                                                          (other, 0), (other, 1)]
    assert source.last_stable(source.partitions([other])) == {(other, 0): 0, (other, 1): 0}

    missing = f"eo_missing_{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigurationError, match=f"Kafka topic '{missing}' does not exist on {bootstrap}"):
        source.partitions([topic_name, missing])


def test_the_kafka_sinks_check_reads_its_output_topics_metadata_only(bootstrap, topic_name):
    """The check names a missing output topic, and reads the broker's transaction limit from the broker leading the
    topic; never the cluster's metadata."""
    from airflow_eo.sinks import KafkaTransactionalSink
    from tests.support.kafka_group import kafka_adapter

    out = create_topic(bootstrap, topic_name, 1)
    adapter = kafka_adapter(bootstrap, "p", KafkaTransactionalSink(topic=out, transaction_timeout_ms=3_600_000))
    adapter._admin = NoClusterMetadata(adapter._admin)
    with pytest.raises(ConfigurationError, match="transaction.max.timeout.ms=900000"):
        adapter.check()
    kafka_adapter(bootstrap, "p", KafkaTransactionalSink(topic=out)).check()  # within the limit: passes

    missing = f"eo_missing_{uuid.uuid4().hex[:8]}"
    adapter = kafka_adapter(bootstrap, "p", KafkaTransactionalSink(topic=missing))
    adapter._admin = NoClusterMetadata(adapter._admin)
    with pytest.raises(ConfigurationError, match=f"output topic '{missing}' does not exist: create it first"):
        adapter.check()


def test_the_transactional_producer_starts_on_its_output_topics_metadata_and_creates_no_topic(bootstrap, topic_name,
                                                                                                monkeypatch):
    """Before ``init_transactions`` the producer reads the output topic's metadata (a broker connection up first), not
    the cluster's. A producer that names a topic asks the broker to create it by default: its configuration says not
    to (a configuration check: the stack's broker creates no topic either way)."""
    from confluent_kafka import Producer

    from airflow_eo.kafka import sink as kafka_sink
    from airflow_eo.sinks import KafkaTransactionalSink
    from tests.support.kafka_group import kafka_adapter

    asked: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    made: list[dict[str, Any]] = []

    class Recorded(Producer):
        def __init__(self, config: dict[str, Any]) -> None:
            made.append(dict(config))
            super().__init__(config)

        def list_topics(self, *args: Any, **kwargs: Any) -> Any:
            asked.append((args, kwargs))
            return super().list_topics(*args, **kwargs)

    monkeypatch.setattr(kafka_sink, "Producer", Recorded)
    out = create_topic(bootstrap, topic_name, 1)
    adapter = kafka_adapter(bootstrap, f"p_{topic_name}", KafkaTransactionalSink(topic=out))
    producer = adapter.producer()
    try:
        assert [args or kwargs.get("topic") for args, kwargs in asked] == [(out,)]
        assert made[0]["allow.auto.create.topics"] is False
        producer.begin_transaction()  # init_transactions ran: the producer is a transactional one, ready
        producer.abort_transaction(30)
    finally:
        adapter.close()


def test_planning_reads_each_partitions_log_start_stable_end_and_high_watermark_from_its_own_look_up(bootstrap,
                                                                                                    topic_name):
    """The look-ups a batch's planning makes go to the broker together (``_list_offsets_together``): each answer must
    still land on its own question (two answers swapped fail this test). Partition 0's log starts at 4 (records
    deleted), partition 1 has an open transaction's three records above its last stable offset."""
    import time
    from datetime import datetime, timezone

    from confluent_kafka import Producer, TopicPartition

    from airflow_eo.core.planning import Interval, PartitionOffsets

    create_topic(bootstrap, topic_name, 2)
    base = int(time.time() * 1000) - 60_000
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        plain.produce(topic_name, f"a{i}".encode(), partition=0, timestamp=base + i)
    for i in range(5):
        plain.produce(topic_name, f"b{i}".encode(), partition=1, timestamp=base + i)
    assert plain.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic_name, 0, 4)], request_timeout=30).values():
        future.result()
    open_txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"eo_test_{uuid.uuid4().hex[:8]}"})
    open_txn.init_transactions(30)
    open_txn.begin_transaction()
    for i in range(3):
        open_txn.produce(topic_name, f"t{i}".encode(), partition=1, timestamp=base + 10 + i)
    assert open_txn.flush(30) == 0
    try:
        source = KafkaOffsetSource({"bootstrap.servers": bootstrap})
        assert source.partition_offsets([topic_name], "earliest") == [
            PartitionOffsets(topic_name, 0, log_start=4, last_stable=10, initial=4),
            PartitionOffsets(topic_name, 1, log_start=0, last_stable=5, initial=0)]
        assert [p.initial for p in source.partition_offsets([topic_name], "latest")] == [10, 5]
        found = {(o.topic, o.partition): o for o in source.interval_offsets(
            [topic_name], Interval(*(datetime.fromtimestamp((base + ms) / 1000, timezone.utc) for ms in (3, 7))))}
        assert [(o.log_start, o.last_stable, o.high_watermark) for o in found.values()] == [(4, 10, 10), (0, 5, 8)]
        assert (found[(topic_name, 0)].start, found[(topic_name, 1)].start) == (4, 3)
    finally:
        open_txn.abort_transaction(30)
