"""The offset store keeps its connections open between transactions (``airflow_eo/sqlstore/connections.py``), on
the real MariaDB and the real PostgreSQL: reused while they answer, replaced when the server dropped them, discarded
after an error, never shared with a forked child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial

import pytest

from airflow_eo.mysql.database import DATABASE as MYSQL
from airflow_eo.postgres.database import DATABASE as POSTGRES
from airflow_eo.sqlstore import connections
from airflow_eo.sqlstore.store import SqlOffsetStore

STORES = {"mysql": partial(SqlOffsetStore, MYSQL), "postgres": partial(SqlOffsetStore, POSTGRES)}
SESSION_ID = {"mysql": "SELECT CONNECTION_ID() AS id", "postgres": "SELECT pg_backend_pid() AS id"}
KILL = {"mysql": "KILL %s", "postgres": "SELECT pg_terminate_backend(%s)"}


@pytest.fixture(params=sorted(STORES))
def kind(request) -> str:
    return request.param


@pytest.fixture
def store(kind, request) -> SqlOffsetStore:
    store = STORES[kind](request.getfixturevalue(f"{kind}_kwargs"))
    store.close()  # no connection kept by an earlier test of this process
    yield store
    store.close()


def _session(store: SqlOffsetStore, kind: str) -> int:
    with store.transaction() as cur:
        cur.execute(SESSION_ID[kind])
        return int(cur.fetchone()["id"])


def _kill(store: SqlOffsetStore, kind: str, session: int, request) -> None:
    """End ``session`` from another session of the server (what its restart or an idle timeout does)."""
    conn = store.database.store_connection(request.getfixturevalue(f"{kind}_kwargs"))  # not a kept one
    try:
        with conn.cursor() as cur:
            cur.execute(KILL[kind], (session,))
        conn.commit()
    finally:
        conn.close()


def test_transactions_of_a_store_reuse_one_connection_and_stores_of_one_database_share_it(store, kind, request):
    first = _session(store, kind)
    assert _session(store, kind) == first
    # another store object on the same database (a trigger's next poll, the next run in this process)
    assert _session(STORES[kind](request.getfixturevalue(f"{kind}_kwargs")), kind) == first


def test_a_connection_the_server_ended_is_replaced_and_the_transaction_runs(store, kind, request, monkeypatch):
    first = _session(store, kind)
    _kill(store, kind, first, request)
    monkeypatch.setattr(connections, "ALIVE_BYPASS_S", 0)  # idle long enough to be asked whether it answers
    second = _session(store, kind)
    assert second != first
    assert _session(store, kind) == second


def test_a_connection_lost_right_after_its_last_transaction_fails_the_next_one_and_is_replaced(store, kind, request,
                                                                                               monkeypatch):
    """Within the alive-bypass window a kept connection is handed out unasked: one the server ended meanwhile fails
    its transaction with the driver's error (as one lost during the transaction does), and is discarded."""
    asked = []
    alive = store.database.connection_alive
    monkeypatch.setattr(type(store.database), "connection_alive",
                        lambda self, conn: asked.append(conn) or alive(conn))
    monkeypatch.setattr(connections, "ALIVE_BYPASS_S", 60)  # the kill below is inside the window however slow
    store.close()
    first = _session(store, kind)
    assert _session(store, kind) == first and asked == []  # reused at once, not asked
    _kill(store, kind, first, request)
    with pytest.raises(store.database.errors()):
        _session(store, kind)
    second = _session(store, kind)
    assert second != first
    monkeypatch.setattr(connections, "ALIVE_BYPASS_S", 0)  # past the window
    assert _session(store, kind) == second and len(asked) == 1  # asked, and it answered


def test_a_failed_transaction_discards_its_connection(store, kind):
    first = _session(store, kind)
    with pytest.raises(store.database.errors()), store.transaction() as cur:
        cur.execute("SELECT * FROM eo_no_such_table")
    assert _session(store, kind) != first


def test_a_rolled_back_write_is_not_seen_by_the_next_transaction_on_the_same_connection(store, kind):
    store.migrate()
    pipeline = f"conn_{os.getpid()}_{kind}"
    with pytest.raises(RuntimeError), store.transaction() as cur:
        cur.execute("INSERT INTO eo_pipeline (pipeline_id, epoch) VALUES (%s, 7)", (pipeline,))
        raise RuntimeError("the caller's own error, after a write")
    with store.transaction() as cur:
        cur.execute("SELECT COUNT(*) AS n FROM eo_pipeline WHERE pipeline_id = %s", (pipeline,))
        assert cur.fetchone()["n"] == 0


def test_a_forked_child_connects_on_its_own_and_leaves_the_parents_connection_working(store, kind):
    parent = _session(store, kind)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own session, and it exits without closing anything of the parent's
        try:
            os.write(write, str(_session(store, kind)).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = int(os.read(read, 64).decode())
    os.close(read)
    os.waitpid(pid, 0)
    assert child != parent
    assert _session(store, kind) == parent  # the parent's kept connection was neither used nor closed


def test_an_unreachable_store_fails_with_the_drivers_error(kind, request):
    kwargs = dict(request.getfixturevalue(f"{kind}_kwargs"), port=1, connect_timeout=2)
    with pytest.raises(STORES[kind](kwargs).database.errors()), STORES[kind](kwargs).transaction():
        pass


#: a process that runs one store transaction and exits normally; its first at-exit handler (the last to run) says
#: whether the server still has the transaction's session; "leave" takes away the store's closing at exit
EXITING_PROCESS = """
import atexit, json, sys, time
import pymysql
kwargs, mode = json.loads(sys.argv[1]), sys.argv[2]
session = []

def after_the_store_closed():
    conn = pymysql.connect(**kwargs)
    with conn.cursor() as cur:
        for _ in range(50):
            cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", session)
            if cur.fetchone()[0] == 0:
                print("GONE")
                return
            time.sleep(0.1)
    print("LEFT")

atexit.register(after_the_store_closed)
from airflow_eo.mysql.database import DATABASE
from airflow_eo.sqlstore import connections
from airflow_eo.sqlstore.store import SqlOffsetStore
if mode == "leave":
    atexit.unregister(connections.close_kept)
with SqlOffsetStore(DATABASE, kwargs).transaction() as cur:
    cur.execute("SELECT CONNECTION_ID() AS id")
    session.append(cur.fetchone()["id"])
"""


def test_a_process_that_exits_closes_its_kept_connections(mysql_kwargs):
    """A kept connection left open at exit is dropped with the process: MariaDB counts it as an aborted client (and
    logs it with ``log_warnings`` >= 2). A process that exits normally closes them first."""
    def exiting(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", EXITING_PROCESS, json.dumps(mysql_kwargs), mode], check=True,
                              timeout=120, capture_output=True, text=True).stdout.strip()

    assert exiting("leave") == "LEFT"  # still open when the process's last handler runs (the check below can fail)
    assert exiting("close") == "GONE"
