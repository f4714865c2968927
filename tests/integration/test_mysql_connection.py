"""Connections to the real MariaDB share the TLS context of pymysql's default mode (building one per connection
cost ~36 ms), and still work with and without TLS options."""

from __future__ import annotations

from airflow_eo.mysql import connection as mysql_connection


def test_connections_without_tls_options_share_one_context_and_work(mysql_kwargs):
    first = mysql_connection.connect(mysql_kwargs, autocommit=True)
    second = mysql_connection.connect(mysql_kwargs, autocommit=True)
    try:
        assert first.ctx is not None and first.ctx is second.ctx
        for conn in (first, second):
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                assert cur.fetchone() == (1,)
    finally:
        first.close()
        second.close()


def test_a_connection_with_tls_options_builds_its_own_context(mysql_kwargs):
    shared = mysql_connection.connect(mysql_kwargs, autocommit=True)
    disabled = mysql_connection.connect(mysql_kwargs, autocommit=True, ssl_disabled=True)
    try:
        assert getattr(disabled, "ctx", None) is None  # no TLS at all: nothing shared, nothing built
        with disabled.cursor() as cur:
            cur.execute("SELECT 2")
            assert cur.fetchone() == (2,)
    finally:
        shared.close()
        disabled.close()
