"""The connections a process keeps open between a batch's short steps: the offset store's transactions and the SQL
sink's driver-side steps (its checks, recovery and commit of prepared branches) (``docs/architecture.md``, "The
offset store").

A batch's protocol runs about ten short store transactions and three or four sink steps; a connection of its own for
each cost a TCP and authentication handshake every time (PostgreSQL's: 8 ms here). A process keeps a few idle
connections per database (and use: the store's transactions, the sink's autocommit steps) in SQLAlchemy's pool, and
before it hands one out again asks the database whether it still answers (the server may have restarted, or closed it
while idle), unless it came back less than :data:`ALIVE_BYPASS_S` ago (as HikariCP's ``aliveBypassWindowMs``: a
batch's steps follow each other within milliseconds, and each question was a round trip; a connection lost in that
window fails its step as one lost during it would, and is discarded). A step that fails discards its connection; one
kept longer than :data:`RECYCLE_S` is replaced (a moved server, rotated credentials). A forked child starts with no
kept connection: it never writes on its parent's sockets. A process that exits normally closes its kept connections
(else the server counts each as an aborted client and may log it); an Airflow task's process ends with ``os._exit``,
which runs no at-exit handler, so the micro-batch operator closes its store's and its sink's at the end of its task.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.pool import QueuePool

#: idle connections a process keeps per database and use (more may be open at once; those close when done)
KEPT = 2
#: seconds after which a kept connection is closed and replaced at its next use
RECYCLE_S = 600
#: a connection back in the pool for less than this many seconds is handed out without asking whether it answers
ALIVE_BYPASS_S = 0.5

_pools: dict[str, QueuePool] = {}
_pools_lock = threading.Lock()
#: a parent's pools, as a forked child inherited them: never used, never closed (their sockets are the parent's)
_inherited: list[dict[str, QueuePool]] = []


def _after_fork_in_child() -> None:
    global _pools, _pools_lock
    _inherited.append(_pools)
    _pools, _pools_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def close_kept() -> None:
    """Close every connection this process keeps (the next use connects anew)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        with suppress(Exception):  # a server already gone: nothing left to end politely
            pool.dispose()


def _pool(key: str, connect: Callable[[], Any], alive: Callable[[Any], bool]) -> QueuePool:
    pool = _pools.get(key)
    if pool is not None:
        return pool
    # Imported here: a Spark executor unpickles the sink's database descriptor, which imports this module, and a
    # cluster's executors have no SQLAlchemy (they never keep a connection).
    from sqlalchemy import event, exc
    from sqlalchemy.pool import QueuePool

    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            # The transaction commits or rolls back itself: nothing to reset when a connection comes back.
            pool = QueuePool(connect, pool_size=KEPT, max_overflow=-1, recycle=RECYCLE_S, reset_on_return=None)

            @event.listens_for(pool, "connect")
            def _fresh(dbapi_connection: Any, record: Any) -> None:
                record.info["fresh"] = True

            @event.listens_for(pool, "checkin")
            def _returned(dbapi_connection: Any, record: Any) -> None:
                record.info["returned"] = time.monotonic()

            @event.listens_for(pool, "checkout")
            def _check(dbapi_connection: Any, record: Any, proxy: Any) -> None:
                # SQLAlchemy's pessimistic check: on DisconnectionError the pool connects anew (fresh: not asked).
                if record.info.pop("fresh", False):
                    return
                idle = time.monotonic() - record.info.get("returned", 0.0)
                if idle >= ALIVE_BYPASS_S and not alive(dbapi_connection):
                    raise exc.DisconnectionError("the kept connection no longer answers")

            _pools[key] = pool
        return pool


def close_kept_under(key: str) -> None:
    """Close the idle connections this process keeps under ``key`` (the next use connects anew)."""
    with _pools_lock:
        pool = _pools.pop(key, None)
    if pool is not None:
        pool.dispose()


def pool_key(database: Any, connect_kwargs: Mapping[str, Any], use: str) -> str:
    """The key of a database's kept connections of one ``use`` (each use's connections are made alike)."""
    return json.dumps([use, type(database).__module__, type(database).__qualname__, dict(connect_kwargs)],
                      sort_keys=True, default=repr)


@contextmanager
def kept_connection(key: str, connect: Callable[[], Any], alive: Callable[[Any], bool],
                    closed: Callable[[Any], bool], errors: tuple[type[BaseException], ...]) -> Iterator[Any]:
    """A connection of the ones this process keeps under ``key`` (made by ``connect``; ``alive`` asks an idle one
    whether it still answers): back among them after the block, unless the block raised or the driver saw the
    connection close meanwhile (``closed``: an error the block caught and went on from). The block leaves the
    connection as it found it (no transaction open, no session setting changed)."""
    proxy = _pool(key, connect, alive).connect()
    try:
        yield proxy.dbapi_connection
    except BaseException:
        with suppress(*errors):
            proxy.invalidate()
        raise
    if closed(proxy.dbapi_connection):
        with suppress(*errors):
            proxy.invalidate()
    else:
        proxy.close()  # back to the pool


class StoreConnections:
    """One store database's connections: :meth:`transaction` on a kept connection when the database can tell a
    live one (``keeps_connections``), else on a new one each time.

    :param database: the room's descriptor (``store_connection``, ``connection_alive``, ``errors``).
    :param connect_kwargs: the driver's arguments.
    """

    def __init__(self, database: Any, connect_kwargs: Mapping[str, Any]) -> None:
        self._database = database
        self._connect_kwargs = dict(connect_kwargs)
        self._reuse = database.keeps_connections
        self._key = pool_key(database, self._connect_kwargs, "store")

    def _connect(self) -> Any:
        return self._database.store_connection(self._connect_kwargs)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One transaction: committed on success, rolled back (and its connection closed) on error."""
        if not self._reuse:
            conn = self._connect()
            try:
                yield from self._in_transaction(conn)
            finally:
                with suppress(*self._database.errors()):
                    conn.close()
            return
        with kept_connection(self._key, self._connect, self._database.connection_alive,
                             self._database.connection_closed, self._database.errors()) as conn:
            yield from self._in_transaction(conn)

    def _in_transaction(self, conn: Any) -> Iterator[Any]:
        try:
            with conn.cursor() as cur:
                yield cur
            conn.commit()
        except BaseException:
            # Best effort: on a lost connection (the server crashed) the server rolls back by itself, and a failing
            # ROLLBACK must not hide the error that says what happened.
            with suppress(*self._database.errors()):
                conn.rollback()
            raise

    def close(self) -> None:
        """Close the idle connections this process keeps for the database (the next transaction connects anew)."""
        close_kept_under(self._key)
