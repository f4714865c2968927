"""Connections to the real MariaDB share the TLS context of pymysql's default mode (building one per connection
cost ~36 ms), and still work with and without TLS options; verified TLS from the connection's extra; the server
reads no local file but the one a bulk load is sending; the write sessions take no gap lock that blocks another
task's insert."""

from __future__ import annotations

import json
import uuid

import certifi
import pymysql
import pytest

from airflow_eo.core.connections import ConnectionInfo
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


def test_the_server_reads_no_local_file_but_the_one_being_loaded(mysql_kwargs, tmp_path):
    """A server may ask a ``local_infile`` connection for any file, on any statement: a writer's connection (the
    bulk load's options) sends only the file it is loading, and fails the statement with a clear error otherwise."""
    loaded = tmp_path / "rows.csv"
    loaded.write_text("loaded\n")
    conn = mysql_connection.connect(mysql_kwargs, autocommit=False, charset="utf8mb4", local_infile=True)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TEMPORARY TABLE eo_local_file (line TEXT)")
            for name, loading in (("/etc/hostname", None), ("/etc/hostname", str(loaded)), (str(loaded), None)):
                with pytest.raises(pymysql.err.OperationalError, match="asked to read the local file") as refused:
                    if loading is None:
                        cur.execute("LOAD DATA LOCAL INFILE %s INTO TABLE eo_local_file", (name,))
                    else:
                        with mysql_connection.loading_local_file(conn, loading):
                            cur.execute("LOAD DATA LOCAL INFILE %s INTO TABLE eo_local_file", (name,))
                assert name in str(refused.value) and "refused, nothing was sent" in str(refused.value)
                cur.execute("SELECT COUNT(*) FROM eo_local_file")
                assert cur.fetchone() == (0,)  # nothing was read, and the connection still answers
            with mysql_connection.loading_local_file(conn, str(loaded)):
                assert cur.execute("LOAD DATA LOCAL INFILE %s INTO TABLE eo_local_file", (str(loaded),)) == 1
            cur.execute("SELECT line FROM eo_local_file")
            assert cur.fetchall() == (("loaded",),)
    finally:
        conn.close()


def test_tls_options_in_the_connection_extra_verify_the_server_and_never_fall_back_to_plaintext(mysql_kwargs):
    """``{"ssl": {"ca": ...}}`` in a ``mysql`` connection's extra (a dict, or JSON text as Airflow's MySQL hook
    takes) reaches pymysql: TLS is required and verified, so the stack's server (no TLS) is refused, not used in
    plaintext as pymysql's default mode would."""
    ca = certifi.where()
    for tls in ({"ca": ca}, json.dumps({"ca": ca})):
        info = ConnectionInfo("eo_tls", "mysql", mysql_kwargs["host"], mysql_kwargs["port"], mysql_kwargs["user"],
                              mysql_kwargs["password"], mysql_kwargs["database"], {"ssl": tls})
        kwargs = mysql_connection.connect_kwargs(info)
        assert kwargs["ssl"] == {"ca": ca}
        with pytest.raises(pymysql.err.OperationalError, match="SSL is required but the server doesn't support it"):
            mysql_connection.connect(kwargs, autocommit=True)


def test_sessions_are_strict_even_on_a_server_whose_default_is_not(mysql_kwargs):
    """A non-strict server cuts a too-long value with a warning; our sessions (sinks and store) fail instead."""
    admin = pymysql.connect(**mysql_kwargs, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.sql_mode")
            default = cur.fetchone()[0]
            cur.execute("CREATE TABLE IF NOT EXISTS eo_strict_probe (v VARCHAR(3))")
            cur.execute("SET GLOBAL sql_mode = ''")
        try:
            plain = pymysql.connect(**mysql_kwargs, autocommit=True)
            with plain.cursor() as cur:  # the premise: this server's sessions cut silently
                cur.execute("INSERT INTO eo_strict_probe VALUES ('abcdef')")
                cur.execute("SELECT v FROM eo_strict_probe")
                assert cur.fetchall() == (("abc",),)
            plain.close()
            ours = mysql_connection.connect(mysql_kwargs, autocommit=True)
            with ours.cursor() as cur:
                cur.execute("SELECT @@SESSION.sql_mode")
                assert "STRICT_ALL_TABLES" in cur.fetchone()[0].split(",")
                with pytest.raises(pymysql.err.DataError, match="Data too long"):
                    cur.execute("INSERT INTO eo_strict_probe VALUES ('abcdef')")
            ours.close()
        finally:
            with admin.cursor() as cur:
                cur.execute("SET GLOBAL sql_mode = %s", (default,))
                cur.execute("DROP TABLE eo_strict_probe")
    finally:
        admin.close()


def test_a_write_session_takes_no_gap_lock_that_blocks_another_tasks_insert(mysql_kwargs):
    """Two write tasks' keys interleave: one deletes a key the table lacks, the other inserts a key beside it. At
    REPEATABLE READ the delete locks the gap and the insert waits (InnoDB's deadlocks between tasks); the writers'
    sessions (read_committed_writes) do not."""
    table = f"gap_{uuid.uuid4().hex[:8]}"
    setup = mysql_connection.connect(mysql_kwargs, autocommit=True)
    deleting = mysql_connection.connect(mysql_kwargs, autocommit=False)
    inserting = mysql_connection.connect(mysql_kwargs, autocommit=False)
    try:
        with setup.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY) ENGINE=InnoDB")
            cur.execute(f"INSERT INTO {table} VALUES (1), (10)")
        for conn in (deleting, inserting):
            with conn.cursor() as cur:
                assert mysql_connection.read_committed_writes(cur) is True
                cur.execute("SELECT @@tx_isolation")
                assert cur.fetchone() == ("READ-COMMITTED",)
                cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
        with deleting.cursor() as cur:
            cur.execute(f"DELETE FROM {table} WHERE id = 5")  # no such row: under REPEATABLE READ, a gap lock 1..10
        with inserting.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES (4)")  # waits 1 s and fails there; here it does not wait
        inserting.commit()
        deleting.commit()
        with setup.cursor() as cur:
            cur.execute(f"SELECT id FROM {table} ORDER BY id")
            assert [r[0] for r in cur.fetchall()] == [1, 4, 10]
    finally:
        for conn in (deleting, inserting):
            conn.close()
        with setup.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        setup.close()


class _ServerLoggingStatements:
    """A cursor of a server whose binary log records statements (``log_bin`` on, ``binlog_format=STATEMENT``)."""

    def __init__(self) -> None:
        self.executed: list[str] = []

    def execute(self, statement: str) -> None:
        self.executed.append(statement)

    def fetchone(self) -> tuple[int, str]:
        return 1, "STATEMENT"


def test_a_server_logging_statements_keeps_its_isolation_level():
    cur = _ServerLoggingStatements()
    assert mysql_connection.read_committed_writes(cur) is False
    assert cur.executed == ["SELECT @@log_bin, @@binlog_format"]  # no SET: InnoDB could not log the writes
