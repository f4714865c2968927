"""The customers table's recorded real Debezium change events (``tests/fixtures/debezium/without_schema``), in source
order, produced to a topic of a test's own: for the tests of ``changes="debezium"`` that need a fixed change stream
(the end-to-end tests of ``test_change_data_capture.py`` run the live connector)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "debezium" / "without_schema"
#: Two snapshot reads, a create, an update, a delete and its tombstone, a primary-key change (1 becomes 10).
CASES = ("read", "create", "update", "delete", "primary_key_change")


def recorded() -> list[dict[str, Any]]:
    """Every case's records, in source order, each with its ``key`` and ``value`` as Debezium wrote them."""
    return [r for case in CASES for r in json.loads((FIXTURES / f"{case}.json").read_text())["records"]]


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    """``records`` produced to ``topic`` as the bytes Kafka held (the fixtures' README)."""
    def raw(value: Any) -> bytes | None:
        return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    producer = Producer({"bootstrap.servers": bootstrap})
    for record in records:
        producer.produce(topic, key=raw(record["key"]), value=raw(record["value"]))
    assert producer.flush(30) == 0


def target_rows(postgres_kwargs: dict[str, Any], table: str) -> list[tuple]:
    """A PostgreSQL target's rows (``id, name, qty``), by id."""
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(f"SELECT id, name, qty FROM {table} ORDER BY id").fetchall()]
