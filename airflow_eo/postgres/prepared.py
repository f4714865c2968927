"""The one two-phase API of the PostgreSQL sinks (as ``mysql/xa.py`` is MySQL's): every ``PREPARE TRANSACTION``,
``COMMIT PREPARED``, ``ROLLBACK PREPARED`` and read of ``pg_prepared_xacts`` goes through :class:`PreparedTransactions`.

A branch's global id (gid) is the text form of :class:`~airflow_eo.core.xid.Xid` (``eo:<pipeline key>:<batch>/
<epoch>:<partition>:<stage>:<attempt>``): the batch row records the same strings as for an XA sink, and recovery
decides with the same :func:`~airflow_eo.core.recovery.decide_branch`. Committing or rolling back a gid the server no
longer knows (ended before by an earlier attempt or by recovery) is not an error: the caller carries on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from airflow_eo.core.orphans import ScannedBranch
from airflow_eo.core.xid import Xid
from airflow_eo.postgres.connection import connect

#: Our gids, and nothing else: what Xid.encode() writes (checked before a gid is spelled into a statement).
# The key: 40 hex digits, or 12 in a gid prepared before the key was lengthened.
_GID = re.compile(r"eo:(?:[0-9a-f]{40}|[0-9a-f]{12}):\d+/\d+:-?\d+:\d+:\d+")


def gid(xid: Xid) -> str:
    text = xid.encode()
    if not _GID.fullmatch(text):
        raise ValueError(f"not an airflow_eo gid: {text!r}")
    return text


def parse_gid(text: str) -> Xid | None:
    """A ``pg_prepared_xacts.gid`` → our Xid, or None when the transaction is not ours."""
    if not _GID.fullmatch(text):
        return None
    try:
        return Xid.decode(text)
    except ValueError:
        return None


class PreparedTransactions:
    """Prepared transactions on one connection (autocommit for commit, rollback and recover; ``COMMIT PREPARED``
    may not run inside a transaction block).

    :param conn: an open psycopg connection to the sink's database (prepared transactions belong to a database).
    """

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def recover(self, pipeline_id: str | None = None) -> list[Xid]:
        """Our prepared transactions in this database, of ``pipeline_id`` or of any pipeline, sorted."""
        return sorted(x for x, _ in self.recover_with_age(pipeline_id))

    def recover_with_age(self, pipeline_id: str | None = None) -> list[tuple[Xid, datetime]]:
        """Our prepared transactions in this database with when each was prepared."""
        rows = self.conn.execute(
            "SELECT gid, prepared FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'eo:%'"
        ).fetchall()
        found = [(parse_gid(text), prepared) for text, prepared in rows]
        return sorted((x, at) for x, at in found
                      if x is not None and (pipeline_id is None or x.belongs_to(pipeline_id)))

    def scan(self) -> list[ScannedBranch]:
        """Our prepared transactions in this database, of every pipeline, with when each was prepared and the
        relations it holds locked (``pg_locks``: a prepared transaction's locks belong to a dummy process, found
        through its transaction id's lock; its row locks are in the rows, so a relation lock stands for them; a relation
        dropped inside the transaction shows as its oid)."""
        rows = self.conn.execute(
            "SELECT p.gid, p.prepared, (SELECT array_agg(DISTINCT l.relation::regclass::text || ' ' || l.mode) "
            "  FROM pg_locks l WHERE l.pid IS NULL AND l.locktype = 'relation' AND l.mode <> 'AccessShareLock'"
            "   AND l.virtualtransaction = ("
            "    SELECT t.virtualtransaction FROM pg_locks t WHERE t.locktype = 'transactionid' AND t.pid IS NULL"
            "     AND t.transactionid = p.transaction LIMIT 1)) "
            "FROM pg_prepared_xacts p WHERE p.database = current_database() AND p.gid LIKE 'eo:%'").fetchall()
        found = [(parse_gid(text), prepared, locks) for text, prepared, locks in rows]
        return sorted((ScannedBranch(x, prepared, tuple(sorted(locks or ()))) for x, prepared, locks in found
                       if x is not None), key=lambda b: b.xid)

    def prepare(self, xid: Xid) -> None:
        """``PREPARE TRANSACTION``: the connection's open transaction survives the connection (and a server crash)."""
        self.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid(xid))))

    def commit(self, xid: Xid) -> bool:
        """``COMMIT PREPARED``; False when the server no longer knows the transaction (ended before)."""
        return self._end(xid, "COMMIT PREPARED")

    def rollback(self, xid: Xid) -> bool:
        """``ROLLBACK PREPARED``; False when the server no longer knows the transaction (ended before)."""
        return self._end(xid, "ROLLBACK PREPARED")

    def _end(self, xid: Xid, verb: str) -> bool:
        try:
            self.conn.execute(sql.SQL(verb + " {}").format(sql.Literal(gid(xid))))
            return True
        except psycopg.errors.UndefinedObject:  # prepared transaction with identifier ... does not exist
            return False


@contextmanager
def prepared_session(connect_kwargs: Mapping[str, Any]) -> Iterator[PreparedTransactions]:
    """:class:`PreparedTransactions` on a new autocommit connection to the sink's database, closed afterwards."""
    conn = connect(connect_kwargs, autocommit=True)
    try:
        yield PreparedTransactions(conn)
    finally:
        conn.close()  # a prepared transaction survives this


def max_prepared_transactions(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SHOW max_prepared_transactions").fetchone()
    return int(row[0]) if row else 0
