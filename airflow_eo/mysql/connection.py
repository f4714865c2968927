"""Opening a MySQL / MariaDB connection (pymysql), one way for the offset store and the sinks."""

from __future__ import annotations

import contextlib
import json
import os
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

import pymysql
from pymysql.constants import COMMAND, ER
from pymysql.protocol import LoadLocalPacketWrapper

from airflow_eo.core.connections import ConnectionInfo

# Seconds, overridable in the connection's extra: connecting; waiting for one statement's answer
# (longer than innodb_lock_wait_timeout and than the largest multi-row statement); sending one.
TIMEOUTS = {"connect_timeout": 10, "read_timeout": 600, "write_timeout": 600}

_preferred_tls: ssl.SSLContext | None = None


class _Result(pymysql.connections.MySQLResult):
    """pymysql's result, answering a server's ``LOAD DATA LOCAL`` request only for the file being loaded now.

    pymysql sends whichever file the server names, on any statement of a ``local_infile`` connection: a rogue or
    man-in-the-middle server could answer ``XA RECOVER`` with a request for ``/proc/self/environ``. Any other name
    (or any request while no file is being loaded) gets no data and fails the statement.
    """

    def _read_load_local_packet(self, first_packet: Any) -> None:
        conn: Any = self.connection
        requested = LoadLocalPacketWrapper(first_packet).filename
        allowed = getattr(conn, "local_file", None)
        if allowed is not None and requested == os.fsencode(allowed):
            super()._read_load_local_packet(first_packet)  # type: ignore[misc]  # not in pymysql's type stubs
            return
        # An empty packet ends the request without data; the server's answer to it ends the statement.
        conn.write_packet(b"")
        conn._read_packet()
        raise pymysql.err.OperationalError(
            ER.FILE_NOT_FOUND,
            f"the server asked to read the local file {requested.decode(errors='replace')!r}, which this "
            "connection is not loading; refused, nothing was sent (only the file of a running bulk load is).")


class _Connection(pymysql.connections.Connection):
    """pymysql's connection, with the TLS context of its default mode built once per process.

    Given no TLS options, pymysql tries TLS without verifying the server ("preferred") and builds a fresh default
    ``SSLContext`` for every connection; loading the system's CA certificates for it took ~36 ms per connection
    here, most of a batch's protocol time (a batch opens about ten). That context is the same every time (no CA, no
    verification), so it is shared; connections with TLS options build theirs as pymysql does.
    """

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        global _preferred_tls
        build = super()._create_ssl_ctx  # type: ignore[misc]  # not in pymysql's type stubs
        if sslp != {}:
            return build(sslp)
        if _preferred_tls is None:
            _preferred_tls = build(sslp)
        return _preferred_tls

    #: The one local file the server may read now (set by :func:`loading_local_file`); None: no file at all.
    local_file: str | None = None

    def _read_query_result(self, unbuffered: bool = False) -> int | None:
        # pymysql's, with the result that refuses other local files (see _Result)
        self._result = None
        result = _Result(self)
        if unbuffered:
            result.init_unbuffered_query()
        else:
            result.read()
        self._result = result
        if result.server_status is not None:
            self.server_status = result.server_status
        return result.affected_rows

    def show_warnings(self) -> Any:
        # pymysql's, with the same result (its only other reader of a server's answer)
        self._execute_command(COMMAND.COM_QUERY, "SHOW WARNINGS")  # type: ignore[attr-defined]
        result = _Result(self)
        result.read()
        return result.rows


@contextlib.contextmanager
def loading_local_file(conn: Any, path: str) -> Iterator[None]:
    """While inside, ``conn`` (from :func:`connect`) lets the server read ``path`` and no other local file."""
    if not isinstance(conn, _Connection):
        raise TypeError("local files are loaded only through airflow_eo.mysql.connection.connect's connections")
    conn.local_file = path
    try:
        yield
    finally:
        conn.local_file = None


def connect(connect_kwargs: Mapping[str, Any], **options: Any) -> Any:
    """``pymysql.connect(**connect_kwargs, **options)`` (typed ``Any``: its cursor type follows ``cursorclass``).

    Every session is strict (:data:`STRICT_SESSION`), whatever the server's default ``sql_mode``.

    :param connect_kwargs: pymysql arguments from an Airflow ``mysql`` connection (host, port, user, ...).
    :param options: the caller's session options (autocommit, cursor class, client flags, ...).
    """
    return _Connection(**connect_kwargs, **{"init_command": STRICT_SESSION, **options})


#: A server whose default ``sql_mode`` is not strict cuts a too-long string or clamps an out-of-range number with a
#: warning instead of failing the statement: the sink would hold values that differ from the output, silently, and
#: the store could cut an id. Strict mode is added to the session's own modes (the others are kept).
STRICT_SESSION = "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES')"


def connect_kwargs(info: ConnectionInfo) -> dict[str, Any]:
    """pymysql arguments of a ``mysql`` connection (its extra may set ``connect_timeout``, ``read_timeout``,
    ``write_timeout`` in seconds, see :data:`TIMEOUTS`, and ``ssl``: pymysql's TLS options, ``{"ca": path}`` for
    verified TLS).

    :param info: the connection.
    """
    kwargs: dict[str, Any] = {
        "host": info.host or "localhost",
        "port": int(info.port or 3306),
        "user": info.login or "",
        "password": info.password or "",
        "database": info.schema or None,
    }
    extra = info.extra
    # A server that stops answering (a crash that leaves the socket open, a network partition)
    # fails the attempt after these seconds instead of hanging it; the next attempt recovers.
    for name, default in TIMEOUTS.items():
        kwargs[name] = int(extra.get(name, default))
    tls = extra.get("ssl")
    if tls:
        # A dict of pymysql's TLS options, e.g. {"ca": "/path/ca.pem"}: verified TLS, never plaintext (without it
        # pymysql tries TLS unverified and falls back to plaintext); also a JSON text, as Airflow's MySQL hook takes.
        kwargs["ssl"] = json.loads(tls) if isinstance(tls, str) else dict(tls)
    return kwargs
