"""A transform over a change stream (``changes="debezium"`` with ``transform=``): it sees each change's row columns,
``change_op`` and ``change_position``, may compute columns and filter changes out, and what it returns is applied as
changes (by position, deletes included). Fed with real Debezium records (``tests/fixtures/debezium``, recorded from
the stack's Debezium), produced to a topic of their own; the end-to-end tests of ``test_change_data_capture.py`` run
the live connector."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.sinks import PostgresUpsertSink
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, run
from tests.support.recorded_changes import produce, recorded, target_rows

pytestmark = pytest.mark.stack

TRANSFORM = ("SELECT id, upper(name) AS name, qty * 10 AS qty, change_op, change_position FROM kafka_batch "
             "WHERE id <> 10")


def expected(records: list[dict[str, Any]]) -> list[tuple]:
    """The target computed apart: each change applied in order, the transform's filter and columns in Python."""
    table: dict[int, tuple] = {}
    for record in records:
        change = record["value"]
        if change is None:
            continue
        if change["op"] == "d":
            table.pop(change["before"]["id"], None)
        elif change["after"]["id"] != 10:
            after = change["after"]
            qty = None if after["qty"] is None else after["qty"] * 10
            table[after["id"]] = (after["id"], after["name"].upper(), qty)
    return sorted(table.values())


def test_a_transform_over_changes_computes_filters_and_still_applies_them_by_position(bootstrap, postgres_kwargs,
                                                                                      topic_name):
    create_topic(bootstrap, topic_name, 1)
    table = f"cdc_transformed_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name TEXT NOT NULL, qty INT)")
    try:
        records = recorded()
        produce(bootstrap, topic_name, records)
        op = operator(topic_name, PostgresUpsertSink(table=table, key_columns=["id"]), schema="id INT, name STRING, "
                      "qty INT", changes="debezium", transform=TRANSFORM)
        summary = run(op)
        assert summary["records_in"] == len(records)  # the tombstones and the changes the transform dropped count
        assert target_rows(postgres_kwargs, table) == expected(records) == [(2, "TWO", 210)]

        # The snapshot's reads and the create re-sent (a connector restarted from an older offset): older than row
        # 2's position and than the deletes of rows 1 and 3, they change nothing.
        produce(bootstrap, topic_name, records[:3])
        run(op)
        assert target_rows(postgres_kwargs, table) == [(2, "TWO", 210)]

        # A transform that drops what names the change fails the batch, saying what to keep.
        dropping = operator(topic_name, PostgresUpsertSink(table=table, key_columns=["id"]),
                            pipeline_id=f"dropping_{topic_name}", schema="id INT, name STRING, qty INT",
                            changes="debezium", transform="SELECT id, name, qty FROM kafka_batch")
        with pytest.raises(ConfigurationError, match="keeps the key column.*change_op and change_position"):
            run(dropping)
    finally:
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
