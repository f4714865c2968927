"""A real Debezium: the stack's Kafka Connect worker (``make connect``) with Debezium's PostgreSQL connector streams
a table of the stack's PostgreSQL (``wal_level=logical``, ``pgoutput``) into Kafka.

What the change events look like (``op`` c/r/u/d, the tombstone after a delete, a primary-key change as a delete
and a create, ``before``/``after``, ``source.lsn``) and that a worker SIGKILLed mid-stream and started again resumes
its connector from the offsets it had committed to Kafka (re-sending what it had not). The source tables have
REPLICA IDENTITY FULL: with PostgreSQL's default identity (the primary key) an update's ``before`` is null and a
delete's ``before`` holds the key and placeholders ('' for a NOT NULL text column, null for the others).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support.connect import STACK_SCRIPT, Record, read_records, running

pytestmark = pytest.mark.stack


def sql(postgres_kwargs: dict[str, Any], *statements: str) -> None:
    """Each statement its own transaction."""
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@pytest.fixture
def source_table(postgres_kwargs: dict[str, Any]) -> Iterator[str]:
    """A source table (``id int primary key, name text not null, qty int``) with REPLICA IDENTITY FULL."""
    name = f"dbz_src_{uuid.uuid4().hex[:8]}"
    sql(postgres_kwargs, f"CREATE TABLE {name} (id INT PRIMARY KEY, name TEXT NOT NULL, qty INT)",
        f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    yield name
    sql(postgres_kwargs, f"DROP TABLE IF EXISTS {name}")


def stack(*args: str, timeout: float = 600) -> str:
    done = subprocess.run([sys.executable, str(STACK_SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"stack.py {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def op(record: Record) -> str | None:
    """The change's ``op``; None for a tombstone."""
    return None if record.value is None else str(record.payload["op"])


def test_snapshot_then_inserts_updates_deletes_and_a_key_change_as_debezium_writes_them(
        postgres_kwargs, bootstrap, source_table, debezium):
    sql(postgres_kwargs, f"INSERT INTO {source_table} VALUES (1, 'one', 10), (2, 'two', 20), (3, 'three', NULL)")
    connector = debezium(source_table)
    sql(postgres_kwargs,
        f"INSERT INTO {source_table} VALUES (4, 'four', 40)",
        f"UPDATE {source_table} SET qty = 21 WHERE id = 2",
        f"DELETE FROM {source_table} WHERE id = 3",
        f"UPDATE {source_table} SET id = 10 WHERE id = 1")  # a primary-key change

    records = read_records(bootstrap, connector.topic, lambda got: len(got) >= 10)
    assert [op(r) for r in records] == ["r", "r", "r", "c", "u", "d", None, "d", None, "c"]
    # The JSON converter's wrapper: {"schema": ..., "payload": ...} on keys and values (the worker's default).
    assert set(records[0].value) == {"schema", "payload"} and set(records[0].key) == {"schema", "payload"}
    keys = [r.key["payload"]["id"] for r in records]  # the primary key; the snapshot's rows in the table's order
    assert sorted(keys[:3]) == [1, 2, 3] and keys[3:] == [4, 2, 3, 3, 1, 1, 10]
    snapshot, (create, update, delete, tombstone, key_delete, key_tombstone, key_create) = records[:3], records[3:]

    # The snapshot: reads (op r) of the rows as they were, all at the snapshot's position.
    assert sorted((r.payload["after"]["id"], r.payload["after"]["name"], r.payload["after"]["qty"])
                  for r in snapshot) == [(1, "one", 10), (2, "two", 20), (3, "three", None)]
    assert all(r.payload["before"] is None and r.payload["source"]["snapshot"] in ("first", "true", "last")
               for r in snapshot)
    assert len({r.payload["source"]["lsn"] for r in snapshot}) == 1

    assert (create.payload["before"], create.payload["after"]) == (None, {"id": 4, "name": "four", "qty": 40})
    assert (update.payload["before"], update.payload["after"]) == (
        {"id": 2, "name": "two", "qty": 20}, {"id": 2, "name": "two", "qty": 21})
    assert (delete.payload["before"], delete.payload["after"]) == ({"id": 3, "name": "three", "qty": None}, None)
    # After a delete, a tombstone (null value) with the same key, for log compaction.
    assert tombstone.value is None and tombstone.key == delete.key
    # A primary-key change: a delete of the old key (and its tombstone), then a create of the new one.
    assert (key_delete.payload["before"], key_delete.payload["after"]) == ({"id": 1, "name": "one", "qty": 10}, None)
    assert key_tombstone.value is None and key_tombstone.key == key_delete.key
    assert (key_create.payload["before"], key_create.payload["after"]) == (None, {"id": 10, "name": "one", "qty": 10})

    # source.lsn: every change has one; it grows from transaction to transaction (here one change each); the two
    # halves of the key change are one change of the log and share theirs.
    streamed = [create, update, delete, key_delete, key_create]
    lsns = [r.payload["source"]["lsn"] for r in streamed]
    assert all(isinstance(lsn, int) for lsn in lsns)
    assert snapshot[0].payload["source"]["lsn"] < lsns[0] < lsns[1] < lsns[2] < lsns[3] == lsns[4], lsns
    txids = [r.payload["source"]["txId"] for r in streamed]
    assert txids[0] < txids[1] < txids[2] < txids[3] == txids[4]
    # source.sequence: [the last commit's LSN, this change's LSN] as strings in a JSON string.
    sequences = [json.loads(r.payload["source"]["sequence"]) for r in streamed]
    assert [int(s[1]) for s in sequences] == lsns
    assert all(r.payload["source"]["snapshot"] == "false" for r in streamed)
    # Transaction metadata (provide.transaction.metadata): each change names its transaction; BEGIN and END
    # records of each are on the connector's transaction topic.
    assert [r.payload["transaction"]["id"].split(":")[0] for r in streamed] == [str(t) for t in txids]
    boundaries = read_records(bootstrap, connector.transaction_topic, lambda got: len(got) >= 8)
    assert [r.payload["status"] for r in boundaries] == ["BEGIN", "END"] * 4
    assert [r.payload["event_count"] for r in boundaries if r.payload["status"] == "END"] == [1, 1, 1, 2]


def test_a_worker_killed_mid_stream_resumes_its_connector_when_connect_runs_again(
        postgres_kwargs, bootstrap, source_table, debezium):
    connector = debezium(source_table)
    written: list[int] = []
    stop = threading.Event()

    def write() -> None:  # one insert per transaction, every 10 ms, until told to stop
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute(f"INSERT INTO {source_table} VALUES (%s, 'x', 0)", (len(written) + 1,))
                written.append(len(written) + 1)
                time.sleep(0.01)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        read_records(bootstrap, connector.topic, lambda got: len(got) >= 50)
        stack("kill", "connect")
        killed_at, written_at_kill = time.monotonic(), len(written)
        assert "Kafka Connect: stopped" in stack("status")
        stack("connect")  # as `make connect`: starts the killed worker again
        restarted_at, written_at_restart = time.monotonic(), len(written)
        assert "Kafka Connect: running" in stack("status")
        assert "already running" in stack("connect")  # a second run is harmless
        # The connector streams again: a row written after the restart arrives. (Its status says RUNNING at once:
        # the status topic still holds the killed worker's word, under the same worker id.)
        read_records(bootstrap, connector.topic, timeout=120,
                     until=lambda got: any(r.payload["after"]["id"] > written_at_restart for r in got))
        resumed_at = time.monotonic()
        assert running(connector)
    finally:
        stop.set()
        writer.join(30)
    last = len(written)
    assert last > written_at_restart > written_at_kill  # rows were written while the worker was down and after

    records = read_records(bootstrap, connector.topic,
                           lambda got: {r.payload["after"]["id"] for r in got} >= set(range(1, last + 1)), timeout=120)
    assert {op(r) for r in records} == {"c"}
    ids = [r.payload["after"]["id"] for r in records]
    assert set(ids) == set(range(1, last + 1))  # nothing lost, nothing else
    # A re-sent change is the same change: same position.
    lsn_of: dict[int, set[int]] = {}
    for r in records:
        lsn_of.setdefault(r.payload["after"]["id"], set()).add(r.payload["source"]["lsn"])
    assert all(len(lsns) == 1 for lsns in lsn_of.values())
    resent = sorted(i for i, n in Counter(ids).items() if n > 1)
    # The worker commits its source offsets every second (offset.flush.interval.ms): what it had sent since its last
    # commit before the kill is sent again, once; the re-sent run starts after the first occurrences.
    if resent:
        assert resent == list(range(resent[0], resent[-1] + 1)) and Counter(ids)[resent[0]] == 2
    print(f"\nworker SIGKILLed after {written_at_kill} rows written; `connect` took {restarted_at - killed_at:.1f}s, "
          f"a row written after it arrived {resumed_at - killed_at:.1f}s after the kill; {len(records)} events for "
          f"{last} rows: {len(resent)} re-sent" + (f" (ids {resent[0]}..{resent[-1]})" if resent else ""))
