"""Kafka topics and records for the tests."""

from __future__ import annotations


def create_topic(bootstrap: str, name: str, partitions: int = 3, config: dict[str, str] | None = None) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=config or {})]).values():
        future.result()
    return name


def produce_json(bootstrap: str, topic: str, values: list[dict]) -> None:
    """Each value as one JSON record, in order, with the idempotent producer; all delivered before this returns."""
    import json

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, json.dumps(value).encode())
    assert producer.flush(30) == 0
