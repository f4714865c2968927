"""The one XA API of airflow_eo (as Flink's ``XaFacade``): every ``XA`` statement goes through :class:`XaFacade`.

It absorbs "unknown xid" (``XAER_NOTA``) on commit and rollback: a retry that finds a branch already ended by an
earlier attempt or by recovery carries on. MariaDB answers ``XAER_NOTA`` as well for a branch that is prepared but
still attached to the session that prepared it, which is the case for a moment after an executor closed its
connection (the server detaches the branch when it has processed the quit): checked on MariaDB 10.11, an
``XA COMMIT`` sent right after the close failed and the next one succeeded. So "unknown" counts as "ended" only when
``XA RECOVER`` does not list the branch; a listed one is retried until its session lets go of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pymysql

from airflow_eo.core.errors import UnavailableError
from airflow_eo.core.orphans import ScannedBranch
from airflow_eo.core.xid import Xid, parse_recover_row
from airflow_eo.mysql.connection import connect

ER_XAER_NOTA = 1397  # unknown xid: already committed / rolled back
ER_XAER_RMFAIL = 1399  # not allowed in the branch's state (a deadlock's victim is ROLLBACK ONLY)
ER_SPECIFIC_ACCESS_DENIED = 1227


class XaFacade:
    """XA on one connection (MySQL and MariaDB allow one XA transaction per connection).

    :param conn: an open pymysql connection.
    :param attached_timeout_s: how long commit and rollback wait for a prepared branch that another session still
        holds (an executor's connection closing, or a live one of an attempt that has not stopped yet).
    """

    def __init__(self, conn: pymysql.connections.Connection, attached_timeout_s: float = 60.0) -> None:
        self.conn = conn
        self.attached_timeout_s = attached_timeout_s

    def recover(self, pipeline_id: str | None = None) -> list[Xid]:
        """Prepared branches that are ours (our formatID), of ``pipeline_id`` or of any pipeline, sorted."""
        with self.conn.cursor() as cur:
            cur.execute("XA RECOVER")
            rows = cur.fetchall()
        ours = [x for x in (parse_recover_row(*row[:4]) for row in rows) if x is not None]
        return sorted(x for x in ours if pipeline_id is None or x.belongs_to(pipeline_id))

    def scan(self) -> list[ScannedBranch]:
        """Every prepared branch of ours on the server: ``XA RECOVER`` says neither when a branch was prepared nor
        which rows it locks (``information_schema.innodb_trx`` lists prepared transactions without their xid)."""
        return [ScannedBranch(x) for x in self.recover()]

    def start(self, xid: Xid) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"XA START {xid.sql()}")

    def restart(self, xid: Xid) -> None:
        """Rolls back the active branch ``xid`` and starts it again, empty: after a deadlock (the server rolled the
        branch back and left it ROLLBACK ONLY, where ``XA END`` is refused; checked on MariaDB 10.11) or a lock wait
        timeout (the statement alone was rolled back; the branch is still active)."""
        with self.conn.cursor() as cur:
            try:
                cur.execute(f"XA END {xid.sql()}")
            except pymysql.err.OperationalError as exc:
                if not (exc.args and exc.args[0] == ER_XAER_RMFAIL):
                    raise
            cur.execute(f"XA ROLLBACK {xid.sql()}")
            cur.execute(f"XA START {xid.sql()}")

    def prepare(self, xid: Xid) -> None:
        """``XA END`` and ``XA PREPARE``: the branch survives this connection (and a server crash)."""
        with self.conn.cursor() as cur:
            cur.execute(f"XA END {xid.sql()}")
            cur.execute(f"XA PREPARE {xid.sql()}")

    def commit(self, xid: Xid) -> bool:
        """``XA COMMIT``; False when the server no longer knows the branch (ended before)."""
        return self._end(xid, "COMMIT")

    def rollback(self, xid: Xid) -> bool:
        """``XA ROLLBACK``; False when the server no longer knows the branch (ended before)."""
        return self._end(xid, "ROLLBACK")

    def _end(self, xid: Xid, verb: str) -> bool:
        deadline = time.monotonic() + self.attached_timeout_s
        pause = 0.01
        while True:
            try:
                with self.conn.cursor() as cur:
                    cur.execute(f"XA {verb} {xid.sql()}")
                return True
            except pymysql.err.MySQLError as exc:
                if not (exc.args and exc.args[0] == ER_XAER_NOTA):
                    raise
            if xid not in self.recover():
                return False  # ended before, by an earlier attempt or by recovery
            if time.monotonic() >= deadline:
                raise UnavailableError(
                    f"XA {verb} {xid.encode()}: the branch is prepared but another session of the sink's server "
                    f"still holds it after {self.attached_timeout_s:.0f}s (an executor of an attempt that has not "
                    "stopped); nothing was changed, the next attempt's recovery ends it: stop that attempt's Spark "
                    "application, or find the session with SHOW PROCESSLIST")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


@contextmanager
def xa_session(connect_kwargs: Mapping[str, Any]) -> Iterator[XaFacade]:
    """An :class:`XaFacade` on a new connection to the sink's server, closed afterwards."""
    conn = connect(connect_kwargs, autocommit=True, charset="utf8mb4")
    try:
        yield XaFacade(conn)
    finally:
        conn.close()  # a prepared branch survives this (checked: keeps_prepared_xa)
