"""Tombstones as deletes (``on_tombstone="delete"``) under the real operator (real Kafka, Spark, MariaDB and
PostgreSQL): a keyed topic of inserts, updates and tombstones interleaved (a key deleted then written again in one
batch, one deleted in a later batch, one deleted that never existed), SIGKILLed while writing and after the commit
point, then retried: the table equals the compacted view of the produced events. Also the writers' two paths
(bulk staging and multi-row statements) on the same events, and a tombstone without a key."""

from __future__ import annotations

import functools
import json
import os
import signal
import uuid
from typing import Any

import pyarrow as pa
import pytest

from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import BadRecordError
from airflow_eo.hooks.offset_store import OffsetStoreHook
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.operator_harness import rows, run_job
from tests.support.page_views import run_child
from tests.support.postgres import PG_STORE, pg_rows, store_batches
from tests.support.stores import MYSQL_STORE

SCHEMA = "id STRING NOT NULL, name STRING, n INT"
DDL = "CREATE TABLE {name} (id VARCHAR(64) NOT NULL PRIMARY KEY, name VARCHAR(64) NULL, n INT NULL)"
Event = tuple[str | None, dict[str, Any] | None]  # (Kafka key, value; None: a tombstone)


def produce(bootstrap: str, topic: str, events: list[Event]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for key, value in events:
        producer.produce(topic, key=key.encode() if key is not None else None,
                         value=json.dumps(value).encode() if value is not None else None)
    assert producer.flush(30) == 0


def compacted(events: list[Event]) -> dict[str, tuple[str | None, int | None]]:
    """What the topic says the table holds: each key's last event, a tombstone meaning no row."""
    table: dict[str, tuple[str | None, int | None]] = {}
    for key, value in events:
        assert key is not None
        if value is None:
            table.pop(key, None)
        else:
            table[key] = (value["name"], value["n"])
    return table


def upsert(key: str, name: str, n: int) -> Event:
    return key, {"id": key, "name": name, "n": n}


def first_batch() -> list[Event]:
    keys = [f"k{i:02d}" for i in range(30)]
    events = [upsert(k, "first", 1) for k in keys]
    events += [upsert(k, "updated", 2) for k in keys[:10]]
    events += [(k, None) for k in keys[10:20]]  # deleted ..
    events += [upsert(k, "again", 3) for k in keys[15:20]]  # .. and 15-19 written again in the same batch
    events += [(f"never{i}", None) for i in range(3)]  # deletes of rows that never existed
    events += [upsert("k29", "last", 4), ("k28", None), upsert("k28", "back", 5), ("k28", None)]
    return events


def second_batch() -> list[Event]:
    events: list[Event] = [(f"k{i:02d}", None) for i in range(5)]  # deleted in a later batch
    events += [upsert("k10", "returned", 6), upsert("k25", "changed", 7), ("k26", None)]
    return events


def writer_rows(events: list[Event]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        {"id": key, "name": (value or {}).get("name"), "n": (value or {}).get("n"), DELETE_COLUMN: value is None}
        for key, value in events])


@pytest.mark.parametrize("database", ["mysql", "postgres"])
def test_both_write_paths_apply_tombstones_in_offset_order(database, mysql_kwargs, postgres_kwargs):
    """The partition writers straight (no Spark): bulk staging and statements leave the compacted view, and a
    replay of the same rows changes nothing."""
    events = first_batch() + second_batch()
    columns = ("id", "name", "n", DELETE_COLUMN)
    for bulk in (True, False):
        table = f"del_w_{uuid.uuid4().hex[:8]}"
        common = {"table": table, "columns": columns, "key_columns": ("id",), "updates": {}, "pipeline_key": "t",
                  "batch_id": 1, "epoch": 1}
        if database == "mysql":
            from airflow_eo.mysql.writer import PartitionWriter as MySqlWriter

            rows(mysql_kwargs, DDL.format(name=table))
            writer: Any = MySqlWriter(connect_kwargs=mysql_kwargs, row_alias=False, rows_per_statement=4, xa=False,
                                      bulk_load=bulk, **common)
            query, read = f"SELECT id, name, n FROM {table}", functools.partial(rows, mysql_kwargs)
        else:
            if not bulk:
                continue  # PostgreSQL always stages (COPY); its row copy is the same SQL
            from airflow_eo.postgres.writer import PartitionWriter as PgWriter

            pg_rows(postgres_kwargs, DDL.format(name=table))
            writer = PgWriter(connect_kwargs=postgres_kwargs, two_phase=False, **common)
            query, read = f"SELECT id, name, n FROM {table}", functools.partial(pg_rows, postgres_kwargs)
        for _ in range(2):  # the second time: a replay
            writer(iter([writer_rows(events)]), 0, 0, 0)
            assert {r[0]: (r[1], r[2]) for r in read(query)} == compacted(events), f"bulk={bulk}"


@pytest.mark.parametrize("database", ["mysql", "postgres"])
def test_tombstones_delete_exactly_once_through_sigkills(database, bootstrap, mysql_kwargs, postgres_kwargs,
                                                         airflow_db):
    topic = create_topic(bootstrap, f"del_{database}_{uuid.uuid4().hex[:8]}", 3)
    table = f"del_{uuid.uuid4().hex[:8]}"
    env = {f"AIRFLOW_CONN_{PG_STORE.upper()}": os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"]}
    if database == "mysql":
        rows(mysql_kwargs, DDL.format(name=table))
        store, kind = MYSQL_STORE, "MySqlUpsertSink"
        read = lambda: rows(mysql_kwargs, f"SELECT id, name, n FROM {table}")  # noqa: E731
    else:
        pg_rows(postgres_kwargs, DDL.format(name=table))
        store, kind = PG_STORE, "PostgresUpsertSink"
        read = lambda: pg_rows(postgres_kwargs, f"SELECT id, name, n FROM {table}")  # noqa: E731
        os.environ.update(env)  # this process reads the store too
    OffsetStoreHook(store).get_store().migrate()
    pipeline = f"del_{topic}"
    job = {"topic": topic, "pipeline_id": pipeline, "offset_store_conn_id": store,
           "options": {"schema": SCHEMA, "key_format": "string"},
           "sink": {"kind": kind, "table": table, "key_columns": ["id"], "on_tombstone": "delete"}}

    def child(run_id: str, fault: str | None = None) -> Any:
        return run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})],
                         fault=fault, env=env)

    def table_view() -> dict[str, tuple[Any, Any]]:
        return {r[0]: (r[1], r[2]) for r in read()}

    produced = first_batch()
    produce(bootstrap, topic, produced)
    crashed = child("first", "during_write")
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    run_job({**job, "run_id": "first"})  # the same run again, in this process (its Spark session is warm)
    assert table_view() == compacted(produced)

    later = second_batch()
    produce(bootstrap, topic, later)
    produced += later
    crashed = child("second", "after_commit_point")
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    assert store_batches(store, postgres_kwargs, mysql_kwargs, pipeline)[-1]["state"] == "committed"
    run_job({**job, "run_id": "second"})  # the same run again, in this process (its Spark session is warm)
    expected = compacted(produced)
    assert table_view() == expected and "k00" not in expected and expected["k10"] == ("returned", 6)

    # A tombstone without a key names no row: a bad record with a clear error, nothing committed.
    produce(bootstrap, topic, [(None, None), upsert("k05", "not written", 8)])
    with pytest.raises(BadRecordError, match="tombstone without a key"):
        run_job({**job, "run_id": "third"})
    assert table_view() == expected
