"""Kafka topics for the tests."""

from __future__ import annotations


def create_topic(bootstrap: str, name: str, partitions: int = 3, config: dict[str, str] | None = None) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=config or {})]).values():
        future.result()
    return name
