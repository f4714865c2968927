"""Every librdkafka client of the Kafka room starts from the room's defaults (``kafka/timeouts.py``), under what the
connection's extra sets (no stack needed: a client connects only when first asked)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.kafka.sink import KafkaTransactionalAdapter
from airflow_eo.kafka.timeouts import CLIENT_DEFAULTS


def test_the_offset_source_connects_with_the_room_defaults_under_the_connection_extra():
    source = KafkaOffsetSource({"bootstrap.servers": "127.0.0.1:1"})
    assert source.config == {"bootstrap.servers": "127.0.0.1:1", **CLIENT_DEFAULTS}
    assert CLIENT_DEFAULTS["reconnect.backoff.ms"] < 100  # librdkafka's default made a new client wait ~50 ms
    assert CLIENT_DEFAULTS["allow.auto.create.topics"] is False  # naming a topic never asks the broker to create it
    mine = KafkaOffsetSource({"bootstrap.servers": "127.0.0.1:1", "reconnect.backoff.ms": 300})
    assert mine.config["reconnect.backoff.ms"] == 300  # the connection's extra wins


def test_the_kafka_sink_connects_with_the_room_defaults_under_the_connection_extra():
    sink = KafkaTransactionalAdapter({"bootstrap.servers": "127.0.0.1:1", "reconnect.backoff.ms": 300}, "p",
                                     name="n", topic="t", key_column="k", value_column="v",
                                     transaction_timeout_ms=60_000)
    assert sink.config["reconnect.backoff.ms"] == 300
    sink = KafkaTransactionalAdapter({"bootstrap.servers": "127.0.0.1:1"}, "p", name="n", topic="t", key_column="k",
                                     value_column="v", transaction_timeout_ms=60_000)
    assert sink.config["reconnect.backoff.ms"] == CLIENT_DEFAULTS["reconnect.backoff.ms"]


def answered(value: object) -> Future:
    """An admin call's future, already answered with ``value`` (an exception: raised by ``result()``)."""
    future: Future = Future()
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


def test_a_metadata_look_up_asked_again_after_a_transient_error_asks_the_new_client():
    """A transient error makes a new admin client (an old one may keep asking with stale leader epochs): the next try
    of the topics' description must go to it, not to the client the first try used."""

    class Admin:
        def __init__(self, fails: bool) -> None:
            self.fails, self.asked = fails, 0

        def describe_topics(self, topics, request_timeout):
            self.asked += 1
            answer = (KafkaException(KafkaError(KafkaError._TRANSPORT)) if self.fails
                      else SimpleNamespace(partitions=[SimpleNamespace(id=1), SimpleNamespace(id=0)]))
            return {topic: answered(answer) for topic in topics.topic_names}

    source = KafkaOffsetSource({"bootstrap.servers": "127.0.0.1:1"})
    old, new = Admin(fails=True), Admin(fails=False)
    source._admin = old
    source._new_client = lambda: setattr(source, "_admin", new)  # what a refresh does: a client of its own
    assert [(tp.topic, tp.partition) for tp in source.partitions(["t"])] == [("t", 0), ("t", 1)]
    assert (old.asked, new.asked) == (1, 1)


def test_the_kafka_sinks_check_asks_a_broker_of_the_cluster_when_its_topic_has_no_leader():
    """The transaction limit is read from the broker leading the output topic, or, while none leads it (a broker
    restarting), from any broker of the cluster."""

    class Admin:
        def __init__(self) -> None:
            self.asked: list[str] = []

        def describe_topics(self, topics, request_timeout):
            leaderless = SimpleNamespace(partitions=[SimpleNamespace(id=0, leader=None)])
            return {topic: answered(leaderless) for topic in topics.topic_names}

        def describe_cluster(self, request_timeout):
            return answered(SimpleNamespace(nodes=[SimpleNamespace(id=7)]))

        def describe_configs(self, resources):
            self.asked.extend(r.name for r in resources)
            return {r: answered({"transaction.max.timeout.ms": SimpleNamespace(value="900000")}) for r in resources}

    sink = KafkaTransactionalAdapter({"bootstrap.servers": "127.0.0.1:1"}, "p", name="n", topic="t", key_column="k",
                                     value_column="v", transaction_timeout_ms=3_600_000)
    sink._admin = admin = Admin()
    with pytest.raises(ConfigurationError, match="transaction.max.timeout.ms=900000"):
        sink.check()
    assert admin.asked == ["7"]
