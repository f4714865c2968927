"""Database passwords on a network the connection does not trust.

A server, or anyone on the path posing as it (TLS unverified is TLS stripped), can ask the client for the password
in clear text: MySQL's auth switch to ``mysql_clear_password`` (or PAM's ``dialog``), PostgreSQL's ``password``
method. Ours refuse unless the connection opts in, and a connection to a server across a network without verified
TLS is warned about. The MySQL side is a man in the middle written here (it is the attacker, not a stand-in for a
server); the PostgreSQL side is a real server whose ``pg_hba.conf`` asks for the password in clear text.
"""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pymysql
import pytest

from airflow_eo.core import connections as core_connections
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.mysql import connection as mysql_connection
from airflow_eo.postgres import connection as postgres_connection
from tests.support.stack import load_stack, server_folder

PASSWORD = "hunter2-Secret"


def _packet(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload


def _read_packet(conn: socket.socket) -> bytes:
    header = b""
    while len(header) < 4:
        chunk = conn.recv(4 - len(header))
        if not chunk:
            return b""
        header += chunk
    size = int.from_bytes(header[:3], "little")
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            break
        body += chunk
    return body


class ClearTextAsker:
    """Accepts one MySQL client: a handshake offering mysql_native_password (no TLS), then, whatever the client
    answers, an auth switch to ``plugin``; keeps every byte the client sent after the switch."""

    def __init__(self, plugin: bytes) -> None:
        self.plugin = plugin
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.after_switch = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(10)
            capabilities = 0x1 | 0x8 | 0x200 | 0x8000 | 0x80000  # LONG_PASSWORD, WITH_DB, 41, SECURE, PLUGIN_AUTH
            salt = b"abcdefgh" + b"ijklmnopqrst"
            handshake = (b"\x0a" + b"10.11.0-man-in-the-middle\x00" + struct.pack("<I", 7) + salt[:8] + b"\x00"
                         + struct.pack("<H", capabilities & 0xFFFF) + b"\x21" + struct.pack("<H", 2)
                         + struct.pack("<H", capabilities >> 16) + bytes([21]) + b"\x00" * 10 + salt[8:] + b"\x00"
                         + b"mysql_native_password\x00")
            conn.sendall(_packet(0, handshake))
            _read_packet(conn)  # the client's handshake response (a scramble, not the password)
            prompt = b"\x04Password: " if self.plugin == b"dialog" else b""
            conn.sendall(_packet(2, b"\xfe" + self.plugin + b"\x00" + prompt))
            try:
                self.after_switch = _read_packet(conn)
                conn.sendall(_packet(4, b"\x00\x00\x00\x02\x00\x00\x00"))  # OK: "welcome"
            except OSError:
                pass

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.listener.close()


@pytest.mark.parametrize("plugin", [b"mysql_clear_password", b"dialog"])
def test_a_mysql_server_asking_for_the_password_in_clear_text_never_gets_it(plugin):
    asker = ClearTextAsker(plugin)
    try:
        kwargs = {"host": "127.0.0.1", "port": asker.port, "user": "eo", "password": PASSWORD, "connect_timeout": 5}
        with pytest.raises(pymysql.err.OperationalError, match="asked for the password in clear text.*refused"):
            mysql_connection.connect(kwargs)
    finally:
        asker.close()
    assert PASSWORD.encode() not in asker.after_switch


def test_a_connection_that_opts_in_answers_a_clear_text_request():
    """What plain pymysql does for any server (the hole), ours only with ``enable_cleartext_plugin``."""
    asker = ClearTextAsker(b"mysql_clear_password")
    info = ConnectionInfo("opted_in", "mysql", "127.0.0.1", asker.port, "eo", PASSWORD, None,
                          {"enable_cleartext_plugin": True, "connect_timeout": 5})
    try:
        with pytest.raises(pymysql.err.MySQLError):  # the man in the middle knows no more of the protocol
            mysql_connection.connect(mysql_connection.connect_kwargs(info), autocommit=True)
    finally:
        asker.close()
    assert asker.after_switch == PASSWORD.encode() + b"\x00"


@pytest.fixture
def fresh_warnings(monkeypatch) -> None:
    monkeypatch.setattr(core_connections, "_WARNED", set())


def test_a_server_across_a_network_without_verified_tls_is_warned_about_once(fresh_warnings, caplog):
    remote = ConnectionInfo("db_remote", "mysql", "db.example.com", 3306, "eo", PASSWORD)
    with caplog.at_level(logging.WARNING, logger="airflow_eo.core.connections"):
        mysql_connection.connect_kwargs(remote)
        mysql_connection.connect_kwargs(remote)
        mysql_connection.connect_kwargs(ConnectionInfo("db_local", "mysql", "127.0.0.1", 3306, "eo", PASSWORD))
        mysql_connection.connect_kwargs(ConnectionInfo("db_verified", "mysql", "db.example.com", 3306, "eo", PASSWORD,
                                                       None, {"ssl": {"ca": "/etc/ssl/ca.pem"}}))
        mysql_connection.connect_kwargs(ConnectionInfo("db_unverified", "mysql", "10.1.2.3", 3306, "eo", PASSWORD,
                                                       None, {"ssl": {"ca": "/ca.pem", "verify_mode": "none"}}))
        postgres_connection.connect_kwargs(ConnectionInfo("pg_prefer", "postgres", "pg.example.com", 5432, "eo",
                                                          PASSWORD))
        postgres_connection.connect_kwargs(ConnectionInfo("pg_verified", "postgres", "pg.example.com", 5432, "eo",
                                                          PASSWORD, None, {"sslmode": "verify-full"}))
        postgres_connection.connect_kwargs(ConnectionInfo("pg_local", "postgres", "::1", 5432, "eo", PASSWORD))
    warned = [r.getMessage() for r in caplog.records]
    assert [m.split("'")[1] for m in warned] == ["db_remote", "db_unverified", "pg_prefer"], warned
    assert all(PASSWORD not in m for m in warned)
    assert '"ssl": {"ca"' in warned[0] and '"sslmode": "verify-full"' in warned[2]


@pytest.fixture
def cleartext_postgres() -> Iterator[int]:
    """A throwaway PostgreSQL server whose pg_hba.conf asks TCP clients for their password in clear text."""
    stack = load_stack()
    bin_dir, as_user = stack.postgres_bin_dir(), stack.postgres_user()
    home = server_folder("eo-pg-cleartext-", as_user)
    data = home / "data"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run = {"check": True, "capture_output": True, "cwd": home, **as_user}
    (Path(home) / "pw").write_text(PASSWORD)
    if as_user:
        import os

        os.chown(home / "pw", as_user["user"], as_user["group"])
    subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "eo", f"--pwfile={home / 'pw'}",
                    "--auth-local=trust", "--auth-host=password", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"],
                   **run)
    ctl = [str(bin_dir / "pg_ctl"), "-D", str(data)]
    subprocess.run([*ctl, "-w", "-l", str(home / "log"), "-o",
                    f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off", "start"], **run)
    try:
        yield port
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True, cwd=home, **as_user)
        subprocess.run(["rm", "-rf", str(home)], check=False)


def test_a_postgres_server_asking_for_the_password_in_clear_text_is_refused_unless_the_extra_allows_it(
        cleartext_postgres):
    if psycopg.pq.version() < 160000:
        pytest.skip(f"libpq {psycopg.pq.version()} cannot refuse an authentication method (require_auth: 16+)")
    info = ConnectionInfo("pg_cleartext", "postgres", "127.0.0.1", cleartext_postgres, "eo", PASSWORD, "postgres")
    with pytest.raises(psycopg.OperationalError, match="password"):
        postgres_connection.connect(postgres_connection.connect_kwargs(info))
    # libpq's own parameter in the connection's extra opts in.
    allowed = ConnectionInfo("pg_cleartext_allowed", "postgres", "127.0.0.1", cleartext_postgres, "eo", PASSWORD,
                             "postgres", {"require_auth": "password"})
    with postgres_connection.connect(postgres_connection.connect_kwargs(allowed)) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
