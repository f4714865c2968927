"""The recipe for a new database (``docs/architecture.md``), checked: a toy room (``tests/support/toy_database.py``,
SQLite) registers one descriptor, its writer and two specs, and the SQL table sink written once
(:mod:`airflow_eo.sqlsink`) runs on it through the registry: checks, upserts that a replay rewrites, new columns,
dead letters, prepared branches committed, rolled back and listed, and its driver's errors in one line."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from airflow_eo.core import drivers, sink_kinds
from airflow_eo.core.batch import BatchContext, BatchRecord, DeadLetter, WritePlan, WriteResult
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.errors import ConfigurationError
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
