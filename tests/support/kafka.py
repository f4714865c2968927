"""Kafka topics and records for the tests."""

from __future__ import annotations


def create_topic(bootstrap: str, name: str, partitions: int = 3, config: dict[str, str] | None = None) -> str:
    """The topic, created and described by the broker with its partitions: a creation succeeds before every broker's
    metadata has the topic, and a pipeline asked at once found no topic (seen once in a fresh clone's run: "Kafka
    topic .. does not exist" right after its creation). Materialize's ``create_new_topic`` waits the same way."""
    import time

    from confluent_kafka.admin import AdminClient, NewTopic

    from airflow_eo.kafka.offsets import described_topics

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=config or {})]).values():
        future.result()
    deadline = time.monotonic() + 30
    while (description := described_topics(lambda: admin, [name])[name]) is None or len(
            description.partitions) != partitions:
        assert time.monotonic() < deadline, f"topic {name} created but not described by the broker within 30 s"
        time.sleep(0.05)
    return name


def produce_json(bootstrap: str, topic: str, values: list[dict]) -> None:
    """Each value as one JSON record, in order, with the idempotent producer; all delivered before this returns."""
    import json

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, json.dumps(value).encode())
    assert producer.flush(30) == 0
