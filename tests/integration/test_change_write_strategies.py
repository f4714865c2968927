"""Whichever write a change stream's batch gets, the positions of the changes it wrote are recorded, once per key and
with the batch: by the write tasks themselves (one pass, bad records dead-lettered; the barrier vote, bad records
fatal) or by a job of its own (two passes: more writer tasks than the session's task slots, so no vote). Fed with the
recorded real Debezium records (``tests/fixtures/debezium``), as ``test_change_transform.py``."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.sinks import PostgresUpsertSink
from airflow_eo.sqlsink.change_positions import CHANGE_POSITION_TABLE
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, run
from tests.support.recorded_changes import produce, recorded, target_rows

pytestmark = pytest.mark.stack


def last_changes(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each key's last change event, in source order (the fixtures' order)."""
    last: dict[int, dict[str, Any]] = {}
    for record in records:
        change = record["value"]
        if change is not None:
            last[(change["before"] if change["op"] == "d" else change["after"])["id"]] = change
    return last


def recorded_positions(postgres_kwargs: dict[str, Any], pipeline_id: str) -> list[tuple[int, int]]:
    """The pipeline's change positions: (deleted, batch) of each key."""
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        return sorted((int(r[0]), int(r[1])) for r in conn.execute(
            f"SELECT deleted, batch_id FROM {CHANGE_POSITION_TABLE} WHERE pipeline_key = %s",
            (seen_pipeline_key(pipeline_id),)).fetchall())


@pytest.mark.parametrize("strategy, options", [
    ("one pass", {"on_bad_record": "dead_letter"}),
    ("vote", {}),
    ("two passes", {"write_partitions": 3}),  # more tasks than the local session's 2 slots: no barrier stage
])
def test_each_write_records_the_positions_of_the_changes_it_wrote(strategy, options, bootstrap, postgres_kwargs,
                                                                  topic_name):
    create_topic(bootstrap, topic_name, 1)
    table = f"cdc_strategy_{uuid.uuid4().hex[:8]}"
    pipeline_id = f"strategy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, name TEXT NOT NULL, qty INT)")
    try:
        records = recorded()
        produce(bootstrap, topic_name, records)
        op = operator(topic_name, PostgresUpsertSink(table=table, key_columns=["id"]), pipeline_id=pipeline_id,
                      schema="id INT, name STRING, qty INT", changes="debezium", **options)
        summary = run(op)
        last = last_changes(records)
        live = sorted((c["after"]["id"], c["after"]["name"], c["after"]["qty"]) for c in last.values()
                      if c["op"] != "d")
        assert target_rows(postgres_kwargs, table) == live
        # One position per key the batch changed, a delete's a marker; by the write tasks unless two passes.
        assert recorded_positions(postgres_kwargs, pipeline_id) == sorted(
            (int(c["op"] == "d"), 0) for c in last.values())
        assert ("change_positions" in summary["seconds"]) is (strategy == "two passes"), summary["seconds"]

        # The snapshot's reads and the create re-sent: older than what the positions hold, they change nothing.
        produce(bootstrap, topic_name, records[:3])
        run(op)
        assert target_rows(postgres_kwargs, table) == live
    finally:
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
