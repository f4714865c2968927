"""Change data capture with a real Debezium (``make connect``: Kafka Connect and Debezium's PostgreSQL connector
streaming a table of the stack's PostgreSQL): ``changes="debezium"`` applies its change events to a MySQL / MariaDB
and a PostgreSQL table through the upsert sinks, and after every committed batch the target equals the source, row
for row (compared with SQL on both sides), whatever Debezium re-sends: a snapshot, inserts, updates, deletes, a
primary-key change, a NULL the target refuses (a dead letter), a new source column, a Connect worker SIGKILLed
mid-stream (it re-sends), a re-snapshot by a connector registered afresh, and our own runs SIGKILLed at each step of
the protocol."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pymysql
import pytest

from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.sinks import MySqlUpsertSink, PostgresUpsertSink
from airflow_eo.sqlsink.change_positions import CHANGE_POSITION_TABLE
from tests.support.children import why
from tests.support.connect import STACK_SCRIPT, DebeziumConnector, Record, read_records, register, remove
from tests.support.operator_harness import operator, run, run_job
from tests.support.page_views import run_child
from tests.support.postgres import PG_STORE, store_batches
from tests.support.stores import MYSQL_STORE
from tests.support.table_formats import format_table

pytestmark = pytest.mark.stack

ROW = "id INT, name STRING, qty INT, note STRING"
# qty 666 is refused only at the write (a CHECK): the write's tasks find the record, which becomes a dead letter.
TARGET_DDL = {
    "mysql": "CREATE TABLE {t} (id INT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT NULL, "
             "CONSTRAINT {t}_not_666 CHECK (qty IS NULL OR qty <> 666))",
    "postgres": "CREATE TABLE {t} (id INT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT NULL, "
                "CONSTRAINT {t}_not_666 CHECK (qty IS NULL OR qty <> 666))",
}


def source_sql(postgres_kwargs: dict[str, Any], *statements: str) -> None:
    """Each statement its own transaction on the source."""
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def source_rows(postgres_kwargs: dict[str, Any], table: str, columns: str = "id, name, qty") -> list[tuple]:
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(f"SELECT {columns} FROM {table} ORDER BY id").fetchall()]


def target_rows(database: str, kwargs: dict[str, Any], table: str, columns: str = "id, name, qty") -> list[tuple]:
    if database == "postgres":
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(f"SELECT {columns} FROM {table} ORDER BY id").fetchall()]
    conn = pymysql.connect(**kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {columns} FROM {table} ORDER BY id")
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def target_sql(database: str, kwargs: dict[str, Any], statement: str) -> None:
    if database == "postgres":
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            conn.execute(statement)
        return
    conn = pymysql.connect(**kwargs, autocommit=True)
    try:
        conn.cursor().execute(statement)
    finally:
        conn.close()


def positions(database: str, kwargs: dict[str, Any], pipeline_id: str, batch_id: int) -> int:
    """How many change positions the pipeline recorded with the batch."""
    query = f"SELECT COUNT(*) FROM {CHANGE_POSITION_TABLE} WHERE pipeline_key = %s AND batch_id = %s"
    key = seen_pipeline_key(pipeline_id)
    if database == "postgres":
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            return int(conn.execute(query, (key, batch_id)).fetchone()[0])
    conn = pymysql.connect(**kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query, (key, batch_id))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def delivered(bootstrap: str, connector: DebeziumConnector, marker: str, timeout: float = 120) -> list[Record]:
    """The topic's records up to the change that wrote ``marker`` into a row's name (the workload's last change):
    Debezium has delivered everything before it."""
    def reached(records: list[Record]) -> bool:
        return any(isinstance(r.payload, dict) and (r.payload.get("after") or {}).get("name") == marker
                   for r in records)

    return read_records(bootstrap, connector.topic, reached, timeout=timeout)


@pytest.fixture
def target(request, mysql_kwargs, postgres_kwargs) -> Iterator[tuple[str, dict[str, Any], str, Any]]:
    """(database, its connection kwargs, a fresh target table, the sink kind); the database by the test's
    ``database`` parameter."""
    database = getattr(request, "param", "mysql")
    kwargs = mysql_kwargs if database == "mysql" else postgres_kwargs
    table = f"cdc_target_{uuid.uuid4().hex[:8]}"
    target_sql(database, kwargs, TARGET_DDL[database].format(t=table))
    sink = MySqlUpsertSink if database == "mysql" else PostgresUpsertSink
    yield database, kwargs, table, sink
    target_sql(database, kwargs, f"DROP TABLE IF EXISTS {table}")


@pytest.fixture
def source(postgres_kwargs) -> Iterator[str]:
    """A source table with PostgreSQL's default replica identity (the primary key), as most are."""
    table = f"cdc_source_{uuid.uuid4().hex[:8]}"
    source_sql(postgres_kwargs, f"CREATE TABLE {table} (id INT PRIMARY KEY, name TEXT, qty INT)")
    yield table
    source_sql(postgres_kwargs, f"DROP TABLE IF EXISTS {table}")


def pipeline(connector: DebeziumConnector, sink: Any, table: str, pipeline_id: str, **options: Any) -> Any:
    """The pipeline: the source's columns (``note`` comes to the source later: NULL until then) into the target,
    which gets a column it lacks (``add_missing_columns``)."""
    return operator(connector.topic, sink(table=table, key_columns=["id"], add_missing_columns=True),
                    pipeline_id=pipeline_id, schema=ROW, changes="debezium", **options)


# Each scenario runs against one target database (the suite's time); both sinks share the code they exercise, and the
# SIGKILL chain below runs on both.
@pytest.mark.parametrize("target", ["mysql"], indirect=True)
def test_the_target_equals_the_source_after_every_batch(target, source, debezium, bootstrap, postgres_kwargs):
    database, kwargs, table, sink = target
    source_sql(postgres_kwargs, *(f"INSERT INTO {source} VALUES ({i}, 'row{i}', {i})" for i in range(1, 21)))
    connector = debezium(source, schemas_enable=True)  # the converter's wrapper here, none in the other tests
    op = pipeline(connector, sink, table, f"cdc_{uuid.uuid4().hex[:8]}", on_bad_record="dead_letter")

    # 1. The snapshot (op r) and a few changes streamed after it.
    source_sql(postgres_kwargs, f"UPDATE {source} SET qty = qty + 100 WHERE id <= 5",
               f"INSERT INTO {source} VALUES (21, 'new', 1)", f"UPDATE {source} SET name = 'm1' WHERE id = 21")
    delivered(bootstrap, connector, "m1")
    summary = run(op)
    assert summary["rows_out"] > 0
    assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source)

    # 2. Updates, deletes, a row deleted and created again, a primary-key change, several changes of one row in one
    # transaction, and the same row changed in many batches' worth of events.
    source_sql(postgres_kwargs, f"DELETE FROM {source} WHERE id IN (2, 3, 4)",
               f"INSERT INTO {source} VALUES (3, 'back', 33)",
               f"UPDATE {source} SET id = 100 WHERE id = 6",
               f"BEGIN; UPDATE {source} SET qty = 1 WHERE id = 7; UPDATE {source} SET qty = 2 WHERE id = 7; "
               f"DELETE FROM {source} WHERE id = 8; INSERT INTO {source} VALUES (8, 'again', 8); COMMIT",
               *(f"UPDATE {source} SET qty = {n} WHERE id = 9" for n in range(30)),
               f"UPDATE {source} SET name = 'm2' WHERE id = 21")
    delivered(bootstrap, connector, "m2")
    run(op)
    assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source)

    # 3. A NULL the target refuses (name NOT NULL there) and a value its CHECK refuses at the write: dead letters
    # that keep the change event as Debezium wrote it; the rows keep their last applied images, and the next
    # change of each row applies.
    source_sql(postgres_kwargs, f"UPDATE {source} SET name = NULL WHERE id = 10",
               f"UPDATE {source} SET qty = 666 WHERE id = 11",
               f"UPDATE {source} SET name = 'm3' WHERE id = 21")
    delivered(bootstrap, connector, "m3")
    summary = run(op)
    assert summary["dead_letters"] == 2
    expected = [r if r[0] not in (10, 11) else (r[0], f"row{r[0]}", r[0])
                for r in source_rows(postgres_kwargs, source)]
    assert target_rows(database, kwargs, table) == expected
    dead = build_sink(op.sink, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 10)  # type: ignore[attr-defined]
    events = {json.loads(bytes(d["raw_value"]))["payload"]["after"]["id"]: (json.loads(bytes(d["raw_value"])), d)
              for d in dead}
    assert sorted(events) == [10, 11]
    refused, letter = events[11]
    assert refused["payload"]["after"] == {"id": 11, "name": "row11", "qty": 666}
    assert letter["error"].startswith(f"table {table} refused it: "), letter["error"]
    assert json.loads(bytes(letter["record_key"]))["payload"] == {"id": 11}
    # Only the written change's position is recorded: a refused change leaves its row's where it was.
    assert positions(database, kwargs, op.pipeline_id, summary["batch_id"]) == 1
    source_sql(postgres_kwargs, f"UPDATE {source} SET name = 'fixed' WHERE id = 10",
               f"UPDATE {source} SET qty = 11 WHERE id = 11",
               f"UPDATE {source} SET name = 'm4' WHERE id = 21")
    delivered(bootstrap, connector, "m4")
    run(op)
    assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source)

    # 4. A new source column (the pipeline's schema has it; the target got it, NULL, with the first batch).
    source_sql(postgres_kwargs, f"ALTER TABLE {source} ADD COLUMN note TEXT",
               f"INSERT INTO {source} VALUES (22, 'with note', 1, 'n22')",
               f"UPDATE {source} SET note = 'noted', name = 'm5' WHERE id = 21")
    delivered(bootstrap, connector, "m5")
    run(op)
    every = "id, name, qty, note"
    assert target_rows(database, kwargs, table, every) == source_rows(postgres_kwargs, source, every)


@pytest.mark.parametrize("target", ["postgres"], indirect=True)
def test_changes_re_sent_by_a_killed_worker_and_a_re_snapshot_roll_nothing_back(
        target, source, debezium, bootstrap, postgres_kwargs, connect_worker):
    database, kwargs, table, sink = target
    source_sql(postgres_kwargs, *(f"INSERT INTO {source} VALUES ({i}, 'row{i}', 0)" for i in range(1, 11)))
    truncates = {"skipped.operations": "none"}  # Debezium skips truncates unless told not to
    connector = debezium(source, schemas_enable=False, overrides=truncates)
    op = pipeline(connector, sink, table, f"cdc_{uuid.uuid4().hex[:8]}", on_truncate="truncate")
    source_sql(postgres_kwargs, *(f"UPDATE {source} SET qty = {n} WHERE id = {1 + n % 10}" for n in range(40)),
               f"UPDATE {source} SET name = 'm1' WHERE id = 1")
    snapshot = delivered(bootstrap, connector, "m1")
    run(op)
    assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source)

    # The Connect worker SIGKILLed while the source changes, then started again: it re-sends what it had not
    # committed an offset for (older changes at newer Kafka offsets).
    stack("kill", "connect")
    source_sql(postgres_kwargs, *(f"UPDATE {source} SET qty = qty + 1 WHERE id = {1 + n % 10}" for n in range(20)))
    stack("connect")
    source_sql(postgres_kwargs, f"UPDATE {source} SET name = 'm2' WHERE id = 1")
    delivered(bootstrap, connector, "m2")
    run(op)
    assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source)

    # A connector registered afresh under the same name (its offsets forgotten) snapshots the table again into the
    # same topic: its reads carry the rows' images again, after newer changes in Kafka order.
    remove(connector, postgres_kwargs, bootstrap, forget_offsets=True, delete_topics=False)
    source_sql(postgres_kwargs, f"UPDATE {source} SET qty = 999 WHERE id = 2")  # not streamed: in the new snapshot
    fresh = register(postgres_kwargs, bootstrap, source, name=connector.name, schemas_enable=False,
                     overrides=truncates)
    debezium.registered.append(fresh)
    source_sql(postgres_kwargs, f"UPDATE {source} SET qty = 5 WHERE id = 3",
               f"UPDATE {source} SET name = 'm3' WHERE id = 1")
    records = delivered(bootstrap, fresh, "m3")
    assert sum(1 for r in records if isinstance(r.payload, dict) and r.payload.get("op") == "r") >= 20  # 2 snapshots
    run(op)
    assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source)

    # Rows changed, then the source truncated (on_truncate="truncate": the target emptied once, and the changes
    # before the truncate, newer than their rows, bring nothing back), rows written again after it; then the first
    # snapshot's reads re-sent.
    source_sql(postgres_kwargs, f"UPDATE {source} SET qty = 77 WHERE id IN (5, 6)", f"TRUNCATE {source}",
               f"INSERT INTO {source} VALUES (3, 'after', 1), (50, 'm4', 2)")
    records = delivered(bootstrap, fresh, "m4")
    assert any(isinstance(r.payload, dict) and r.payload.get("op") == "t" for r in records)
    resend(bootstrap, connector.topic, [r for r in snapshot if isinstance(r.payload, dict)
                                        and r.payload.get("op") == "r"])
    run(op)
    assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source) == [(3, "after", 1),
                                                                                            (50, "m4", 2)]


STEPS = {"mysql": ["during_write", "after_change_positions"], "postgres": ["in_store_commit", "after_commit_point"]}


@pytest.mark.parametrize("target", ["mysql", "postgres"], indirect=True)
def test_our_runs_sigkilled_at_each_step_apply_every_change_once(target, source, debezium, bootstrap,
                                                                  postgres_kwargs, mysql_kwargs, monkeypatch):
    """The operator's process SIGKILLed at each protocol step, then run again: the target equals the source."""
    database, kwargs, table, sink = target
    store = MYSQL_STORE if database == "mysql" else PG_STORE
    env = {f"AIRFLOW_CONN_{PG_STORE.upper()}": os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"]}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # this process runs the batches again
    source_sql(postgres_kwargs, *(f"INSERT INTO {source} VALUES ({i}, 'row{i}', 0)" for i in range(1, 31)))
    connector = debezium(source)
    pipeline_id = f"cdc_{uuid.uuid4().hex[:8]}"
    job = {"topic": connector.topic, "pipeline_id": pipeline_id, "offset_store_conn_id": store,
           "options": {"schema": ROW, "changes": "debezium"},
           "sink": {"kind": sink.__name__, "table": table, "key_columns": ["id"], "add_missing_columns": True}}
    # Every step of the protocol a change-stream batch passes, shared between the two databases (the suite's time):
    # the step a batch dies at is what differs, the sink's code path is the same.
    for n, step in enumerate(STEPS[database]):
        source_sql(postgres_kwargs, f"UPDATE {source} SET qty = qty + {n + 1} WHERE id % 3 = {n % 3}",
                   f"DELETE FROM {source} WHERE id = {20 + n}", f"INSERT INTO {source} VALUES ({40 + n}, 'k', {n})",
                   f"UPDATE {source} SET id = {60 + n} WHERE id = {10 + n}",
                   f"UPDATE {source} SET name = 'm{n}' WHERE id = 1")
        delivered(bootstrap, connector, f"m{n}")
        argv = ["-m", "tests.support.operator_child", json.dumps({**job, "run_id": f"r{n}"})]
        killed = run_child(argv, fault=step, env=env)
        assert killed.returncode == -signal.SIGKILL, (step, why(killed))
        run_job({**job, "run_id": f"r{n}"})  # run again here, in this process's warm Spark session
        assert target_rows(database, kwargs, table) == source_rows(postgres_kwargs, source), step
    batches = store_batches(store, postgres_kwargs, mysql_kwargs, pipeline_id)
    assert {b["state"] for b in batches} == {"committed"}


def stack(*args: str) -> None:
    done = subprocess.run([sys.executable, str(STACK_SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"stack.py {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"


# --------------------------------------------------------------------------- a MariaDB source


def mariadb_sql(mariadb_kwargs: dict[str, Any], *statements: str | tuple[str, ...]) -> None:
    """Each statement its own transaction on the binlog MariaDB; a tuple of statements one transaction."""
    conn = pymysql.connect(**mariadb_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                if isinstance(statement, tuple):
                    conn.begin()
                    for part in statement:
                        cur.execute(part)
                    conn.commit()
                else:
                    cur.execute(statement)
    finally:
        conn.close()


def change_positions(database: str, kwargs: dict[str, Any], pipeline_id: str) -> dict[bytes, bytes]:
    """The pipeline's recorded positions: key id -> position (a delete marker's too)."""
    query = f"SELECT key_id, position FROM {CHANGE_POSITION_TABLE} WHERE pipeline_key = %s"
    key = seen_pipeline_key(pipeline_id)
    if database == "postgres":
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            return {bytes(k): bytes(p) for k, p in conn.execute(query, (key,)).fetchall()}
    conn = pymysql.connect(**kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query, (key,))
            return {bytes(k): bytes(p) for k, p in cur.fetchall()}
    finally:
        conn.close()


def binlog_coordinates(records: list[Record]) -> set[tuple[int, int, int]]:
    """Each change event's (binlog file number, position, row + 1), the row 0 for a snapshot read: the order the
    source wrote them in, as read off the events here (not by the code under test)."""
    return {(int(p["source"]["file"].split(".")[-1]), p["source"]["pos"],
             0 if p["op"] == "r" else p["source"]["row"] + 1)
            for r in records if isinstance(p := r.payload, dict) and "source" in p}


def decoded(position: bytes) -> tuple[int, int, int]:
    low = int.from_bytes(position[8:], "big")
    return int.from_bytes(position[:8], "big"), low >> 24, low & 0xFFFFFF


@pytest.mark.parametrize("target", ["postgres"], indirect=True)
def test_a_mariadb_sources_changes_apply_in_binlog_order(target, binlog_mariadb, mariadb_debezium, bootstrap):
    """Debezium's MariaDB connector reading a binlog (positions: binlog file, position, row) into a PostgreSQL table:
    a snapshot, multi-row statements, deletes, a row deleted and created again, a primary-key change, several changes
    of one row in one transaction; then the first batch's records re-sent byte for byte. After every batch the
    target equals the source (SQL on both sides), every recorded position is one of an applied change's binlog
    coordinates, and no key's position goes back."""
    database, kwargs, table, sink = target
    source = f"cdc_msource_{uuid.uuid4().hex[:8]}"
    mariadb_sql(binlog_mariadb, f"CREATE TABLE {source} (id INT PRIMARY KEY, name VARCHAR(64), qty INT)",
                f"INSERT INTO {source} VALUES " + ", ".join(f"({i}, 'row{i}', {i})" for i in range(1, 21)))
    try:
        connector = mariadb_debezium(source)
        op = pipeline(connector, sink, table, f"cdc_{uuid.uuid4().hex[:8]}")
        seen: dict[bytes, bytes] = {}

        def batch(marker: str) -> list[Record]:
            records = delivered(bootstrap, connector, marker)
            run(op)
            assert target_rows(database, kwargs, table) == target_rows("mysql", binlog_mariadb, source), marker
            now = change_positions(database, kwargs, op.pipeline_id)
            assert {decoded(p) for p in now.values()} <= binlog_coordinates(records), marker
            assert all(now[k] >= seen[k] for k in seen), f"a key's position went back ({marker})"
            seen.update(now)
            return records

        # 1. The snapshot (op r, the binlog's coordinates when it was taken) and changes streamed after it, one of
        # them a statement that changes five rows (one binlog event, rows 0-4).
        mariadb_sql(binlog_mariadb, f"UPDATE {source} SET qty = qty + 100 WHERE id <= 5",
                    f"INSERT INTO {source} VALUES (21, 'new', 1)", f"UPDATE {source} SET name = 'm1' WHERE id = 21")
        first = batch("m1")
        assert any(isinstance(r.payload, dict) and r.payload.get("op") == "r" for r in first)

        # 2. Deletes, a row deleted and created again, a primary-key change, several changes of one row in one
        # transaction, and one row changed thirty times.
        mariadb_sql(binlog_mariadb, f"DELETE FROM {source} WHERE id IN (2, 3, 4)",
                    f"INSERT INTO {source} VALUES (3, 'back', 33)",
                    f"UPDATE {source} SET id = 100 WHERE id = 6",
                    (f"UPDATE {source} SET qty = 1 WHERE id = 7", f"UPDATE {source} SET qty = 2 WHERE id = 7",
                     f"DELETE FROM {source} WHERE id = 8", f"INSERT INTO {source} VALUES (8, 'again', 8)"),
                    *(f"UPDATE {source} SET qty = {n} WHERE id = 9" for n in range(30)),
                    f"UPDATE {source} SET name = 'm2' WHERE id = 21")
        batch("m2")

        # 3. The first batch's records re-sent, byte for byte (a connector restarted from an older offset): the
        # snapshot's reads of rows deleted since stay deleted, the older images of changed rows apply nowhere.
        resend(bootstrap, connector.topic, [r for r in first if r.raw_value is not None])
        mariadb_sql(binlog_mariadb, f"UPDATE {source} SET name = 'm3' WHERE id = 21")
        batch("m3")
    finally:
        mariadb_sql(binlog_mariadb, f"DROP TABLE IF EXISTS {source}")


# --------------------------------------------------------------------------- table formats (Delta, Iceberg)

#: A table format's protocol steps: the first batch is SIGKILLed at each of the first in turn (each attempt meets what
#: the last one left), then runs to its end; the second at the last. (An attempt after a kill past the table's commit
#: rolls the store forward: it never reaches the store's commit point, the other step past it.)
LAKE_STEPS = ["after_plan", "before_table_commit", "after_table_commit"]
LAKE_LAST_STEP = "after_commit_point"


def resend(bootstrap: str, topic: str, records: list[Record]) -> None:
    """``records`` produced again, byte for byte, as a connector restarted from an older offset re-sends them."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for record in records:
        producer.produce(topic, key=record.raw_key, value=record.raw_value)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_table_format_target_equals_the_source_through_sigkills_and_re_sent_changes(
        kind, source, debezium, bootstrap, postgres_kwargs, mysql_kwargs, tmp_path):
    """Debezium's changes MERGEd into a Delta / Iceberg table created by the sink (it adds the position column):
    the first batches SIGKILLed at every protocol step in turn, then run to their end; then real change events re-sent
    after the rows' deletes (a create older than the delete) do not bring the rows back (the delete markers); the
    target equals the source after every batch, and no row's position goes back."""
    table = format_table(kind, tmp_path, "customers", key_columns=["id"])  # created by the sink, with the position

    def target() -> list[tuple]:
        return sorted((r["id"], r["name"], r["qty"], r["_eo_change_position"]) for r in table.rows())

    source_sql(postgres_kwargs, *(f"INSERT INTO {source} VALUES ({i}, 'row{i}', {i})" for i in range(1, 21)))
    connector = debezium(source, schemas_enable=False)
    pipeline_id = f"cdc_{kind}_{uuid.uuid4().hex[:8]}"
    job = {"topic": connector.topic, "pipeline_id": pipeline_id, "offset_store_conn_id": "eo_offset_store",
           "options": {"schema": ROW, "changes": "debezium"}, "sink": table.sink}

    def run_to_end(run_id: str, faults: Sequence[str] = ()) -> None:
        argv = ["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})]
        for fault in faults:
            killed = run_child(argv, fault=fault)
            assert killed.returncode == -signal.SIGKILL, (fault, why(killed))
            if fault == "after_table_commit":  # the table's commit is the batch's: visible before the store knows
                assert [r[:3] for r in target()] == expected()
        done = run_child(argv)
        assert done.returncode == 0, why(done)

    def expected() -> list[tuple]:
        return source_rows(postgres_kwargs, source)

    # 1. The snapshot, updates, deletes, a primary-key change, a row deleted and created again: killed at every
    # step of the protocol in turn, then run to its end.
    source_sql(postgres_kwargs, f"UPDATE {source} SET qty = qty + 100 WHERE id <= 5",
               f"DELETE FROM {source} WHERE id IN (2, 3)", f"UPDATE {source} SET id = 100 WHERE id = 6",
               f"DELETE FROM {source} WHERE id = 8", f"INSERT INTO {source} VALUES (8, 'again', 8)",
               f"UPDATE {source} SET name = 'm1' WHERE id = 1")
    records = delivered(bootstrap, connector, "m1")
    run_to_end("r1", LAKE_STEPS)
    first = target()
    assert [r[:3] for r in first] == expected()

    # 2. The snapshot's reads of rows 2, 3 and 6 (deleted since) re-sent byte for byte, then more changes: the rows
    # stay deleted; a row changed after the re-sent read keeps its newer image.
    stale = [r for r in records if isinstance(r.payload, dict) and r.payload.get("op") == "r"
             and r.payload["after"]["id"] in (2, 3, 4, 6)]
    assert len(stale) == 4
    resend(bootstrap, connector.topic, stale)
    source_sql(postgres_kwargs, f"UPDATE {source} SET qty = 7 WHERE id = 4", f"DELETE FROM {source} WHERE id = 9",
               f"UPDATE {source} SET name = 'm2' WHERE id = 1")
    delivered(bootstrap, connector, "m2")
    run_to_end("r2", [LAKE_LAST_STEP])
    second = target()
    assert [r[:3] for r in second] == expected()
    before = {r[0]: r[3] for r in first}
    assert all(r[3] >= before[r[0]] for r in second if r[0] in before), "a row's position went back"
    batches = store_batches(MYSQL_STORE, postgres_kwargs, mysql_kwargs, pipeline_id)
    assert {b["state"] for b in batches} == {"committed"}
