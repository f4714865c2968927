"""Opening a MySQL / MariaDB connection (pymysql), one way for the offset store and the sinks."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import pymysql

from airflow_eo.core.connections import ConnectionInfo

# Seconds, overridable in the connection's extra: connecting; waiting for one statement's answer
# (longer than innodb_lock_wait_timeout and than the largest multi-row statement); sending one.
TIMEOUTS = {"connect_timeout": 10, "read_timeout": 600, "write_timeout": 600}

_preferred_tls: ssl.SSLContext | None = None


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


def connect(connect_kwargs: Mapping[str, Any], **options: Any) -> Any:
    """``pymysql.connect(**connect_kwargs, **options)`` (typed ``Any``: its cursor type follows ``cursorclass``).

    :param connect_kwargs: pymysql arguments from an Airflow ``mysql`` connection (host, port, user, ...).
    :param options: the caller's session options (autocommit, cursor class, client flags, ...).
    """
    return _Connection(**connect_kwargs, **options)


def connect_kwargs(info: ConnectionInfo) -> dict[str, Any]:
    """pymysql arguments of a ``mysql`` connection (its extra may set ``connect_timeout``, ``read_timeout``,
    ``write_timeout`` in seconds, see :data:`TIMEOUTS`, and ``ssl``).

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
    if extra.get("ssl"):
        kwargs["ssl"] = extra["ssl"]
    return kwargs
