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
