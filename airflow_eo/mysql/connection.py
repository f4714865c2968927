"""Opening a MySQL / MariaDB connection (pymysql), one way for the offset store and the sinks."""

from __future__ import annotations

import contextlib
import json
import os
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

import pymysql
from pymysql.constants import COMMAND, CR, ER
from pymysql.protocol import LoadLocalPacketWrapper

from airflow_eo.core.connections import ConnectionInfo, warn_unverified_tls

# Seconds, overridable in the connection's extra: connecting; waiting for one statement's answer
# (longer than innodb_lock_wait_timeout and than the largest multi-row statement); sending one.
TIMEOUTS = {"connect_timeout": 10, "read_timeout": 600, "write_timeout": 600}

_preferred_tls: ssl.SSLContext | None = None

#: Authentication plugins to which pymysql sends the password as it is: ``dialog`` (PAM) answers its "Password: "
#: prompt with it.
CLEARTEXT_PLUGINS = (b"mysql_clear_password", b"dialog")


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

    def __init__(self, *args: Any, enable_cleartext_plugin: bool = False, **kwargs: Any) -> None:
        # Set before pymysql's __init__, which connects (and authenticates) at once.
        self.enable_cleartext_plugin = enable_cleartext_plugin
        super().__init__(*args, **kwargs)

    def _process_auth(self, plugin_name: bytes, auth_packet: Any, handler: Any = None) -> Any:
        # pymysql answers a server's switch to these plugins with the password itself; a server, or anyone posing
        # as it, asks for it that way to read it. Refused unless the connection opts in, as MySQL's own client
        # (--enable-cleartext-plugin) does.
        if plugin_name in CLEARTEXT_PLUGINS and handler is None and not self.enable_cleartext_plugin:
            raise pymysql.err.OperationalError(
                CR.CR_AUTH_PLUGIN_CANNOT_LOAD,
                f"the server at {self.host}:{self.port} asked for the password in clear text (authentication plugin "
                f"{plugin_name.decode(errors='replace')!r}); refused, the password was not sent. If the server "
                "really authenticates this way (PAM, LDAP), reach it over verified TLS and set "
                '"enable_cleartext_plugin": true in the connection\'s extra')
        return super()._process_auth(plugin_name, auth_packet, handler)  # type: ignore[misc]  # not in the stubs

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


def read_committed_writes(cur: Any) -> bool:
    """Puts the session's transactions at READ COMMITTED, unless the server logs statements
    (``binlog_format=STATEMENT`` cannot log InnoDB writes made under it): whether it did.

    A write task's keys lie between another task's (they are spread by hash). Under REPEATABLE READ, a statement that
    looks up a key the table lacks (the delete of a change stream's deleted key, an upsert's duplicate check) locks
    the gap around it, and the other task's inserts into that gap wait: InnoDB then kills one of the two as a
    deadlock's victim, and its whole transaction runs again (measured: 2 in a batch of 1M changes). READ COMMITTED
    takes no such gap locks; nothing of ours reads what the transaction does not write itself."""
    cur.execute("SELECT @@log_bin, @@binlog_format")
    log_bin, binlog_format = cur.fetchone()
    if int(log_bin) and str(binlog_format).upper() == "STATEMENT":
        return False
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return True


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
    kwargs: dict[str, Any] = {**info.server_login(3306), "database": info.schema or None}
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
    if not verified_tls(kwargs.get("ssl")):
        warn_unverified_tls(info, "MySQL",
                            'put {"ssl": {"ca": "/path/to/ca.pem"}} in its extra (docs/how-to/security.md)')
    if _true(extra.get("enable_cleartext_plugin")):
        kwargs["enable_cleartext_plugin"] = True
    return kwargs


def verified_tls(tls: Mapping[str, Any] | None) -> bool:
    """Whether pymysql's TLS options make it verify the server (as its ``_create_ssl_ctx`` reads them): a CA to check
    the certificate against, and ``verify_mode`` not lowered."""
    if not tls or (tls.get("ca") is None and tls.get("capath") is None):
        return False
    mode = tls.get("verify_mode")
    return mode is None or mode is True or str(mode).lower() in ("required", "2")


def _true(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")
