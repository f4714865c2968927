"""Opening a PostgreSQL connection (psycopg 3), one way for the offset store and the sinks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.json import set_json_loads

from airflow_eo.core.connections import ConnectionInfo, warn_unverified_tls

# Overridable in the connection's extra. A server that stops answering (a crash that leaves the socket open, a
# network partition) fails the attempt after about a minute instead of hanging it; the next attempt recovers.
DEFAULTS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
            "keepalives_count": 3}
# libpq parameters a connection's extra may set (Airflow's postgres connection puts them there too).
EXTRA_PARAMETERS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "target_session_attrs",
                    "require_auth", *DEFAULTS)
#: libpq's ``require_auth`` unless the extra sets its own: any method but ``password``, in which the server (or
#: anyone posing as it) asks for the password in clear text. Needs libpq 16 or later (psycopg's binary wheel has
#: one); an older libpq cannot refuse it.
REQUIRE_AUTH = "!password"
VERIFIED_SSLMODES = ("verify-ca", "verify-full")


def connect_kwargs(info: ConnectionInfo) -> dict[str, Any]:
    """psycopg arguments of a ``postgres`` connection (``schema`` is the database, as in Airflow's provider).

    :param info: the connection.
    """
    kwargs: dict[str, Any] = {**info.server_login(5432), "dbname": info.schema or "postgres", **DEFAULTS}
    for name in EXTRA_PARAMETERS:
        if name in info.extra:
            kwargs[name] = info.extra[name]
    if kwargs.get("sslmode") not in VERIFIED_SSLMODES:
        warn_unverified_tls(info, "PostgreSQL", 'put "sslmode": "verify-full" and "sslrootcert": "/path/to/ca.pem" in '
                            'its extra (docs/how-to/security.md)')
    return kwargs


def _json_text(data: bytes | str) -> str:
    return data.decode() if isinstance(data, bytes) else data


def connect(connect_kwargs: Mapping[str, Any], **options: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect(**connect_kwargs, **options)`` in a UTC session whose JSON values read as text (as
    pymysql reads them: the SQL store's rows are the same on both databases).

    :param connect_kwargs: from :func:`connect_kwargs`.
    :param options: the caller's (``autocommit``, ``row_factory``, ...).
    """
    # Decided where the connection is opened (a Spark executor's libpq may be older than the driver's).
    if "require_auth" not in connect_kwargs and psycopg.pq.version() >= 160000:
        connect_kwargs = {**connect_kwargs, "require_auth": REQUIRE_AUTH}
    conn = psycopg.connect(**connect_kwargs, options="-c TimeZone=UTC", **options)
    set_json_loads(_json_text, conn)
    return conn
