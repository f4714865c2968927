"""The SQL sink's short steps on the driver (its check, its recovery's reads, the commit of prepared branches) run on
one connection the process keeps between them and between batches (``SqlDatabase.driver_connection``), on the real
MariaDB and the real PostgreSQL: reused while it answers, replaced when the server ended it, discarded after a failed
step, closed by the adapter's ``close``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_eo.core.recovery import BranchAction
from airflow_eo.core.xid import Xid, pipeline_key
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.mysql import connection as mysql_connection
from airflow_eo.mysql.xa import XaFacade
from airflow_eo.postgres import connection as postgres_connection
from airflow_eo.postgres.prepared import PreparedTransactions
from airflow_eo.sinks import MySqlXaSink, PostgresTwoPhaseSink
from airflow_eo.sqlstore import connections
from tests.support.sql import database_query
from tests.support.stores import MYSQL_STORE

SPECS = {"mysql": (MySqlXaSink, "mysql_default"), "postgres": (PostgresTwoPhaseSink, "postgres_default")}
ROOMS = {"mysql": mysql_connection, "postgres": postgres_connection}
SESSION_ID = {"mysql": "SELECT CONNECTION_ID()", "postgres": "SELECT pg_backend_pid()"}
KILL = {"mysql": "KILL {}", "postgres": "SELECT pg_terminate_backend({})"}
SESSIONS = {"mysql": "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = {}",
            "postgres": "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE pid = {}"}


@pytest.fixture(params=sorted(SPECS))
def kind(request) -> str:
    return request.param


@pytest.fixture
def sink(kind, request) -> Iterator[Any]:
    """A two-phase sink's adapter on a fresh table, no driver connection kept by an earlier test; its pipeline's
    branches rolled back and its table dropped afterwards."""
    spec, conn_id = SPECS[kind]
    table = f"drv_{uuid.uuid4().hex[:8]}"
    pipeline = f"drv_{table}"
    adapter = build_sink(spec(table=table, key_columns=["k"], conn_id=conn_id), pipeline, MYSQL_STORE)
    adapter.pipeline = pipeline  # type: ignore[attr-defined]  # (the adapter does not keep it)
    query = database_query(adapter.database, adapter.connect_kwargs)  # type: ignore[attr-defined]
    query(f"CREATE TABLE {table} (k INT PRIMARY KEY, v INT)")
    adapter.close()
    try:
        yield adapter
    finally:
        try:  # no branch of the test stays prepared (it would hold the next tests' locks and snapshots)
            adapter.close()  # a connection a test broke is not the one the clean-up uses
            for xid in adapter.in_doubt(pipeline):  # type: ignore[attr-defined]
                adapter.end_branch(xid, BranchAction.ROLLBACK)  # type: ignore[attr-defined]
        finally:
            adapter.close()
            query(f"DROP TABLE IF EXISTS {table}")


def _session(sink: Any, kind: str) -> int:
    with sink.database.driver_connection(sink.connect_kwargs) as conn, conn.cursor() as cur:
        cur.execute(SESSION_ID[kind])
        return int(cur.fetchone()[0])


def _sql(sink: Any, statement: str) -> list[dict[str, Any]]:
    """On a connection of its own (not the kept one)."""
    return database_query(sink.database, sink.connect_kwargs)(statement)  # type: ignore[no-any-return]


def _prepare_branch(sink: Any, kind: str, value: int) -> Xid:
    """A prepared branch of the sink's pipeline writing row ``value``, made on a connection of its own (an executor's,
    gone since)."""
    xid = Xid(pipeline_key(sink.pipeline), batch_id=1, epoch=1, partition=value)
    conn = sink.database.connect(sink.connect_kwargs, autocommit=False)
    try:
        if kind == "mysql":
            xa = XaFacade(conn)
            xa.start(xid)
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {sink.table} VALUES (%s, %s)", (value, value))
            xa.prepare(xid)
        else:
            conn.execute(f"INSERT INTO {sink.table} VALUES (%s, %s)", (value, value))
            PreparedTransactions(conn).prepare(xid)
    finally:
        conn.close()
    return xid


def _counting_connects(kind: str, monkeypatch) -> list[int]:
    made: list[int] = []
    connect = ROOMS[kind].connect
    monkeypatch.setattr(ROOMS[kind], "connect", lambda *a, **k: made.append(1) or connect(*a, **k))
    return made


def test_the_check_the_recovery_read_and_the_commit_of_branches_share_one_kept_connection(sink, kind, monkeypatch):
    made = _counting_connects(kind, monkeypatch)
    sink.check()
    first = _session(sink, kind)
    xids = [_prepare_branch(sink, kind, value) for value in (1, 2)]
    made.clear()
    # a batch's steps: the check, the recovery's read of the pipeline's branches, the commit of each branch
    sink.check()
    assert sink.in_doubt(sink.pipeline) == sorted(xids)
    for xid in xids:
        assert sink.end_branch(xid, BranchAction.COMMIT)
    assert _session(sink, kind) == first
    assert made == [], "a step of the sink's driver opened a connection of its own"
    assert _sql(sink, f"SELECT k FROM {sink.table} ORDER BY k") == [{"k": 1}, {"k": 2}]  # committed, visible
    assert sink.in_doubt(sink.pipeline) == []


def test_a_connection_the_server_ended_is_replaced_and_the_step_runs(sink, kind, monkeypatch):
    first = _session(sink, kind)
    _sql(sink, KILL[kind].format(first))
    monkeypatch.setattr(connections, "ALIVE_BYPASS_S", 0)  # idle long enough to be asked whether it answers
    xid = _prepare_branch(sink, kind, 3)
    assert sink.in_doubt(sink.pipeline) == [xid]
    assert sink.end_branch(xid, BranchAction.ROLLBACK)
    second = _session(sink, kind)
    assert second != first
    assert _sql(sink, f"SELECT COUNT(*) AS n FROM {sink.table}") == [{"n": 0}]


def test_a_failed_step_discards_its_connection(sink, kind):
    first = _session(sink, kind)
    with pytest.raises(sink.database.errors()), sink.database.driver_connection(sink.connect_kwargs) as conn, \
            conn.cursor() as cur:
        cur.execute("SELECT * FROM eo_no_such_table")
    assert _session(sink, kind) != first


def test_close_ends_the_kept_session_on_the_server(sink, kind):
    session = _session(sink, kind)
    assert _sql(sink, SESSIONS[kind].format(session)) == [{"n": 1}]
    sink.close()
    deadline = time.monotonic() + 30  # the server ends the session within moments of the client's goodbye
    while _sql(sink, SESSIONS[kind].format(session)) != [{"n": 0}]:
        assert time.monotonic() < deadline, "the closed connection's session is still on the server"
        time.sleep(0.05)
    assert _session(sink, kind) != session  # the next step connects anew


def test_a_connection_lost_in_a_step_that_caught_its_error_is_not_kept(sink, kind, monkeypatch):
    """A step may catch a driver error and go on (``discard``'s best-effort rollbacks do); if the connection was lost,
    the driver saw it close, and it is discarded instead of handed to the next step unasked."""
    monkeypatch.setattr(connections, "ALIVE_BYPASS_S", 60)  # the next step would get it back without a question
    first = _session(sink, kind)
    with sink.database.driver_connection(sink.connect_kwargs) as conn:
        _sql(sink, KILL[kind].format(first))
        with pytest.raises(sink.database.errors()), conn.cursor() as cur:
            cur.execute(SESSION_ID[kind])
    second = _session(sink, kind)
    assert second != first
    assert _session(sink, kind) == second  # and the new one is kept
