"""The recipe for a new database (``docs/architecture.md``), checked: a toy room (``tests/support/toy_database.py``,
SQLite) registers one descriptor, its writer and two specs, and the SQL table sink written once
(:mod:`airflow_eo.sqlsink`) runs on it through the registry: checks, upserts that a replay rewrites, new columns,
dead letters, prepared branches committed, rolled back and listed, and its driver's errors in one line."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

from airflow_eo.core import drivers, sink_kinds, stores
from airflow_eo.core.batch import (
    BatchContext,
    BatchRecord,
    DeadLetter,
    ExecutionResult,
    RunRequest,
    WritePlan,
    WriteResult,
)
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.planning import PartitionOffsets
from airflow_eo.core.protocol import run_batch
from airflow_eo.core.ranges import OffsetRange
from tests.support import toy_database as toy


@dataclass
class _Field:
    name: str
    spark_type: str

    @property
    def dataType(self) -> Any:  # Spark's name
        return type("T", (), {"simpleString": lambda _: self.spark_type})()


class _Output:
    """The engine's DataFrame as a sink's write reads it: its schema and columns."""

    def __init__(self, rows: list[dict[str, Any]], types: dict[str, str]) -> None:
        self.rows, self.columns = rows, list(types)
        self.schema = type("S", (), {"fields": [_Field(n, t) for n, t in types.items()]})()


class _Runner:
    """The engine's partition runner: one partition, every row (what Spark does per partition, in process)."""

    def run_partitions(self, plan: WritePlan, writer: Any, columns: Sequence[str] | None = None) -> WriteResult:
        xid, rows = writer(iter([pa.RecordBatch.from_pylist(plan.output.rows)]), 0, 0, 0)
        return WriteResult(xids=[xid] if xid else [], rows=rows)

    def to_driver(self, plan: WritePlan, columns: Sequence[str]) -> Any:
        raise NotImplementedError


class _Connections:
    def __init__(self, path: str) -> None:
        self.path = path

    def connection(self, conn_id: str) -> ConnectionInfo:
        return ConnectionInfo(conn_id, toy.CONN_TYPE, schema=self.path)

    def kafka_config(self, conn_id: str) -> dict[str, Any]:
        raise NotImplementedError


def _plan(rows: list[dict[str, Any]], types: dict[str, str]) -> WritePlan:
    return WritePlan(output=_Output(rows, types), runner=_Runner())


def _rows(path: str, table: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
    finally:
        conn.close()


@pytest.fixture
def toy_room(monkeypatch, tmp_path):
    """The toy room registered for this test only; its database file with two empty tables."""
    monkeypatch.setattr(sink_kinds, "_KINDS", dict(sink_kinds._KINDS))
    monkeypatch.setattr(drivers, "_DRIVERS", dict(drivers._DRIVERS))
    monkeypatch.setattr(stores, "_STORES", dict(stores._STORES))
    toy.register()
    path = str(tmp_path / "toy.db")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE counts (app TEXT PRIMARY KEY, pv INTEGER)")
    conn.execute("CREATE TABLE views (app TEXT PRIMARY KEY, pv INTEGER)")
    conn.commit()
    conn.close()
    return path


BATCH = BatchContext("toy_pipeline", 0, "manual__1", 1, (OffsetRange("views", 0, 0, 3),))
ROWS = [{"app": "a", "pv": 1}, {"app": "b", "pv": 2}]


def test_the_upsert_sink_runs_on_a_registered_toy_database(toy_room):
    kind = sink_kinds.sink_kind("ToyUpsertSink")
    assert kind.capabilities.connection_type == toy.CONN_TYPE
    spec = toy.ToyUpsertSink(table="views", key_columns=["app"])
    sink = kind.build(spec, BATCH.pipeline_id, _Connections(toy_room), None)
    assert isinstance(sink, toy.ToyUpsertAdapter)
    sink.check()
    with pytest.raises(ConfigurationError, match="'nowhere' does not exist"):
        kind.build(toy.ToyUpsertSink(table="nowhere", key_columns=["app"]), "p", _Connections(toy_room), None).check()
    with pytest.raises(ConfigurationError, match="accumulating update"):
        toy.ToyUpsertSink(table="views", key_columns=["app"], updates={"pv": "add"})

    types = {"app": "string", "pv": "bigint"}
    for _ in range(2):  # the second time: a replay rewrites the same rows
        assert sink.write(_plan(ROWS, types), BATCH) == WriteResult(rows=2)
        assert _rows(toy_room, "views") == [("a", 1), ("b", 2)]

    # A new output column: refused with the statement to run, or added on request (the descriptor's types).
    wider = {**types, "ratio": "double"}
    with pytest.raises(ConfigurationError, match='ALTER TABLE "views" ADD COLUMN "ratio" REAL'):
        sink.write(_plan([{**ROWS[0], "ratio": 0.5}], wider), BATCH)
    adding = kind.build(toy.ToyUpsertSink(table="views", key_columns=["app"], add_missing_columns=True),
                        BATCH.pipeline_id, _Connections(toy_room), None)
    adding.check()
    adding.write(_plan([{**ROWS[0], "ratio": 0.5}], wider), BATCH)
    assert _rows(toy_room, "views") == [("a", 1, 0.5), ("b", 2, None)]

    # Dead letters: the table made on first use, read back by the operations.
    assert sink.dead_letters(BATCH.pipeline_id, None, 10) is None  # no table yet
    assert sink.write_dead_letters(BATCH, iter([DeadLetter("views", 0, 2, b"k", b"{bad", "malformed JSON")])) == []
    [letter] = sink.dead_letters(BATCH.pipeline_id, None, 10)
    assert (letter["kafka_offset"], letter["raw_value"], letter["error"]) == (2, b"{bad", "malformed JSON")
    assert sink.dead_letters("another_pipeline", None, 10) == []


def test_the_two_phase_sink_runs_on_a_registered_toy_database(toy_room):
    kind = sink_kinds.sink_kind("ToyTwoPhaseSink")
    spec = toy.ToyTwoPhaseSink(table="counts", key_columns=["app"], updates={"pv": "add"})
    sink = kind.build(spec, BATCH.pipeline_id, _Connections(toy_room), None)
    assert isinstance(sink, toy.ToyTwoPhaseAdapter) and sink.two_phase
    sink.check()

    result = sink.write(_plan(ROWS, {"app": "string", "pv": "bigint"}), BATCH)
    [xid] = result.xids
    assert _rows(toy_room, "counts") == [], "nothing is visible before the commit point"
    assert [x.encode() for x in sink.in_doubt(BATCH.pipeline_id)] == [xid]

    # A failed attempt's branch is rolled back; the committed batch's is committed, once.
    stray = sink.write(_plan([{"app": "z", "pv": 9}], {"app": "string", "pv": "bigint"}),
                       BatchContext(BATCH.pipeline_id, 1, "manual__2", 1, BATCH.ranges)).xids
    sink.discard(BatchContext(BATCH.pipeline_id, 1, "manual__2", 1, BATCH.ranges), stray)
    record = BatchRecord(BATCH.pipeline_id, 0, "manual__1", 1, BatchState.COMMITTED, list(BATCH.ranges), xids=[xid])
    sink.finalize(record, [xid])
    sink.finalize(record, [xid])  # a retried finalize finds the branch ended: nothing twice
    assert _rows(toy_room, "counts") == [("a", 1), ("b", 2)]
    assert sink.in_doubt(BATCH.pipeline_id) == []

    # Recovery: a branch of a batch that never committed is rolled back.
    again = sink.write(_plan(ROWS, {"app": "string", "pv": "bigint"}),
                       BatchContext(BATCH.pipeline_id, 2, "manual__3", 2, BATCH.ranges)).xids
    recovery = sink.recover(BATCH.pipeline_id, lambda batch_id: None)
    assert [(d.xid, d.action.value) for d in recovery.branches] == [(again[0], "rollback")]
    assert sink.in_doubt(BATCH.pipeline_id) == []
    assert _rows(toy_room, "counts") == [("a", 1), ("b", 2)]


def test_the_toy_drivers_errors_read_as_one_line(toy_room):
    assert drivers.describe_driver_error(sqlite3.OperationalError("database is locked\n")) == \
        "Toy SQL error: database is locked"


class _Topic:
    """The input topic (``OffsetSource``): one partition; record ``i`` is a page view of app ``APPS[i % 3]``."""

    APPS = ("a", "b", "c")

    def __init__(self) -> None:
        self.end = 0

    def partition_offsets(self, topics: Sequence[str], starting_offsets: str | int) -> list[PartitionOffsets]:
        return [PartitionOffsets("views", 0, log_start=0, last_stable=self.end, initial=0)]

    def interval_offsets(self, topics: Sequence[str], interval: Any) -> list[Any]:
        raise NotImplementedError


class _CountingEngine:
    """``Engine``: reads exactly the batch's ranges of :class:`_Topic`, one row per record (``pv`` 1, added up by
    the sink)."""

    def check(self) -> None:
        return None

    def execute(self, batch: BatchContext, sink: Any) -> ExecutionResult:
        rows = [{"app": _Topic.APPS[offset % 3], "pv": 1} for r in batch.ranges
                for offset in range(r.from_offset, r.until_offset)]
        written = sink.write(_plan(rows, {"app": "string", "pv": "bigint"}), batch)
        return ExecutionResult(records_in=len(rows), rows_out=written.rows, xids=list(written.xids))


def test_a_pipeline_runs_end_to_end_with_its_offset_store_and_sink_on_the_toy_database(toy_room):
    """The store registered by the room (the shared store SQL over the toy's dialect: its timestamps, no row locks)
    and its two-phase sink run the protocol: batches commit their offsets and counts together, a run that dies
    after its write leaves a prepared branch that the next run rolls back, and each record counts once."""
    store = stores.store_for(ConnectionInfo("eo_store", toy.CONN_TYPE, schema=toy_room))
    assert store.database is toy.DATABASE
    kind = sink_kinds.sink_kind("ToyTwoPhaseSink")
    sink = kind.build(toy.ToyTwoPhaseSink(table="counts", key_columns=["app"], updates={"pv": "add"}),
                      "toy_counts", _Connections(toy_room), "eo_store")
    topic = _Topic()

    def run(run_id: str) -> Any:
        return run_batch(RunRequest("toy_counts", run_id, ["views"]), store, topic, _CountingEngine(), sink)

    topic.end = 7
    first = run("manual__1")
    assert (first.batch_id, first.records_in) == (0, 7)
    assert _rows(toy_room, "counts") == [("a", 3), ("b", 2), ("c", 2)]

    topic.end = 12
    commit_batch = store.commit_batch

    def die(*args: Any) -> None:  # the process dies as it calls the commit point: nothing of it is cleaned up
        raise SystemExit("killed at the commit point")

    store.commit_batch = die  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        run("manual__2")
    store.commit_batch = commit_batch  # type: ignore[method-assign]
    [branch] = sink.in_doubt("toy_counts")  # prepared, recorded in the batch row, not committed
    assert store.get_batch("toy_counts", 1).xids == [branch.encode()]
    assert _rows(toy_room, "counts") == [("a", 3), ("b", 2), ("c", 2)]
    retried = run("manual__2")  # the retry rolls the branch back and resumes the batch with its recorded range
    assert (retried.batch_id, retried.records_in, retried.resumed) == (1, 5, True)
    assert sink.in_doubt("toy_counts") == []
    assert run("manual__2").already_committed  # a third attempt finds its run committed

    assert _rows(toy_room, "counts") == [("a", 4), ("b", 4), ("c", 4)], "each of the 12 records counted once"
    assert store.committed_offsets("toy_counts") == {("views", 0): 12}
    [info] = store.pipelines("toy_counts")
    assert info.epoch == 4, "four takes: each attempt fences the ones before it"
    assert abs((datetime.now(timezone.utc) - info.taken_at).total_seconds()) < 60  # the dialect's spelling of now
    assert store.latest_committed_batch_id("toy_counts") == 1
    assert len(store.store_identity()) == 32
