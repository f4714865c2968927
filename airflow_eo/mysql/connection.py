"""Opening a MySQL / MariaDB connection (pymysql), one way for the offset store and the sinks."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import pymysql

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
