"""The one XA API of airflow_eo (as Flink's ``XaFacade``): every ``XA`` statement goes through :class:`XaFacade`.

It absorbs "unknown xid" (``XAER_NOTA``) on commit and rollback: a retry that finds a branch already ended by an
earlier attempt or by recovery carries on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pymysql

from airflow_eo.core.xid import Xid, parse_recover_row
from airflow_eo.mysql.connection import connect

ER_XAER_NOTA = 1397  # unknown xid: already committed / rolled back
ER_SPECIFIC_ACCESS_DENIED = 1227


class XaFacade:
    """XA on one connection (MySQL and MariaDB allow one XA transaction per connection).

    :param conn: an open pymysql connection.
    """

    def __init__(self, conn: pymysql.connections.Connection) -> None:
        self.conn = conn

    def recover(self, pipeline_id: str | None = None) -> list[Xid]:
        """Prepared branches that are ours (our formatID), of ``pipeline_id`` or of any pipeline, sorted."""
        with self.conn.cursor() as cur:
            cur.execute("XA RECOVER")
            rows = cur.fetchall()
        ours = [x for x in (parse_recover_row(*row[:4]) for row in rows) if x is not None]
        return sorted(x for x in ours if pipeline_id is None or x.belongs_to(pipeline_id))

    def start(self, xid: Xid) -> None:
        with self.conn.cursor() as cur:
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
        try:
            with self.conn.cursor() as cur:
                cur.execute(f"XA {verb} {xid.sql()}")
            return True
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] == ER_XAER_NOTA:
                return False
            raise


@contextmanager
def xa_session(connect_kwargs: Mapping[str, Any]) -> Iterator[XaFacade]:
    """An :class:`XaFacade` on a new connection to the sink's server, closed afterwards."""
    conn = connect(connect_kwargs, autocommit=True, charset="utf8mb4")
    try:
        yield XaFacade(conn)
    finally:
        conn.close()  # a prepared branch survives this (checked: keeps_prepared_xa)


def prepared_branches(connect_kwargs: Mapping[str, Any], pipeline_id: str) -> list[Xid]:
    """The pipeline's prepared (in-doubt) branches on a server, sorted; read-only.

    :param connect_kwargs: pymysql arguments of the sink's database.
    :param pipeline_id: the pipeline.
    """
    with xa_session(connect_kwargs) as xa:
        return xa.recover(pipeline_id)
