"""MariaDB: the stack's server (``.stack/mariadb``), a second one for the fault tests (``.stack/mariadb-2``, next
port), one that writes a binlog for Debezium (``.stack/mariadb-binlog``, the port after), or the user's MySQL named
by ``EO_MYSQL_HOST`` (then nothing is started)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from stack_services.layout import (
    BINLOG_MARIADB,
    BINLOG_MARIADB_PORT,
    DB_NAME,
    DB_PASSWORD,
    DB_USER,
    MARIADB_PORT,
    SECOND_MARIADB,
    SECOND_MARIADB_PORT,
    STACK,
)
from stack_services.processes import die, pid_alive, port_open, require, spawn, stop, wait_for

#: what to run when MariaDB's programs are missing
APT_HINT = "install MariaDB (Debian: apt-get update && apt-get install mariadb-server)"


def mysql_settings() -> dict:
    if os.environ.get("EO_MYSQL_HOST"):
        return {
            "host": os.environ["EO_MYSQL_HOST"],
            "port": int(os.environ.get("EO_MYSQL_PORT", "3306")),
            "user": os.environ.get("EO_MYSQL_USER", "root"),
            "password": os.environ.get("EO_MYSQL_PASSWORD", ""),
            "database": os.environ.get("EO_MYSQL_DATABASE", DB_NAME),
            "external": True,
        }
    return {"host": "127.0.0.1", "port": MARIADB_PORT, "user": DB_USER,
            "password": DB_PASSWORD, "database": DB_NAME, "external": False}


def mysql_ready(settings: dict) -> bool:
    import pymysql

    try:
        pymysql.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                        password=settings["password"], database=settings["database"],
                        connect_timeout=2).close()
        return True
    except pymysql.MySQLError:
        return False


def mariadb_up(home: Path | None = None, port: int = MARIADB_PORT, options: Sequence[str] = ()) -> dict:
    """Start (or find running) the MariaDB server of ``home`` on ``port`` (default: the stack's), with the server
    ``options`` besides the stack's."""
    settings = mysql_settings() if home is None else {
        "host": "127.0.0.1", "port": port, "user": DB_USER, "password": DB_PASSWORD, "database": DB_NAME,
        "external": False}
    if settings["external"]:
        print(f"stack: using your MySQL at {settings['host']}:{settings['port']} (EO_MYSQL_HOST)")
        if not mysql_ready(settings):
            die(f"cannot connect to MySQL at {settings['host']}:{settings['port']} as "
                f"{settings['user']} (database {settings['database']}); check EO_MYSQL_* settings")
        return settings
    home = home or STACK / "mariadb"
    # The stack's own server (started by `up`, or again after a fault test's kill) holds the benchmark's batches; the
    # second and binlog servers serve small test loads.
    own = home == STACK / "mariadb"
    batch_sized_log = ("--innodb-log-file-size=1G", "--innodb-log-buffer-size=256M") if own else ()
    pid_file, log, sock = home / "mariadb.pid", home / "error.log", home / "mysqld.sock"
    if pid_alive(pid_file):
        wait_for("MariaDB", lambda: mysql_ready(settings), 60, log)
        grant_stack_user(sock, log)
        print(f"stack: MariaDB already running at 127.0.0.1:{port}")
        return settings
    if port_open(port):
        die(f"port {port} is taken by another process; set EO_STACK_MYSQL_PORT, "
            "or EO_MYSQL_HOST to use that server")
    mariadbd = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/local/sbin")
    if not mariadbd:
        die(f"'mariadbd' not found: {APT_HINT}")
    install_db = require("mariadb-install-db", APT_HINT)
    data = home / "data"
    home.mkdir(parents=True, exist_ok=True)
    fresh = not (data / "mysql").exists()
    if fresh:
        subprocess.run(
            [install_db, f"--datadir={data}", "--user=root", "--auth-root-authentication-method=socket",
             "--skip-test-db"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    # A 1 GiB buffer pool holds a retention window of seen ids (docs/how-to/duplicates.md, "What it costs"): with
    # 256 MiB the 4M-id window's look-up took 2.87 s and its insert 11.2 s, against 0.68 s and 1.35 s at 1 GiB
    # (scripts/seen_id_cost.py); the benchmark's dedup job at 1M went 21-22 s -> 17-19 s. A redo log of 1 GiB (96 MiB
    # by default) holds a batch of 1M events and their ids: with the default, a run of six jobs at 1M (2.8 GB of redo)
    # made InnoDB flush ~270,000 pages early to free the log and the dedup job took 12.1-13.1 s; with 1 GiB and a
    # 256 MiB log buffer, ~58,000 pages and 10.7-12.1 s (docs/how-to/duplicates.md, "What it costs"). The cost: 1 GiB
    # of disk, and after a SIGKILL that follows heavy writes a start may replay up to that much redo (seen: ~6 s
    # after the benchmark; the fault tests' restarts replay a few dozen pages).
    spawn([mariadbd, "--no-defaults", f"--datadir={data}", f"--socket={sock}", f"--port={port}",
           "--bind-address=127.0.0.1", f"--pid-file={home / 'mariadbd.pid'}", f"--log-error={log}",
           "--user=root", "--innodb-buffer-pool-size=1G", "--max-connections=500",
           "--innodb-lock-wait-timeout=20", "--skip-name-resolve", *batch_sized_log, *options],
          home / "stdout.log", pid_file)
    # A SIGKILLed server leaves its socket file behind: wait for the new server to answer on it.
    wait_for("MariaDB socket", lambda: sock.exists() and port_open(port), 120, log)
    grant_stack_user(sock, log)
    wait_for("MariaDB", lambda: mysql_ready(settings), 60, log)
    print(f"stack: MariaDB ready at 127.0.0.1:{port} (database {DB_NAME})")
    return settings


def grant_stack_user(sock: Path, log: Path) -> None:
    """The stack's database and user, with every privilege and GRANT OPTION (the tests make users of their own with
    fewer), as root over the server's socket; at each start, so that a data directory of an older stack gets this
    one's grants. Not in a binlog: a change-data-capture connector reading it would meet them after a restart."""
    mariadb = require("mariadb", APT_HINT)
    sql = ("SET SESSION sql_log_bin = 0;"
           f"CREATE DATABASE IF NOT EXISTS {DB_NAME};"
           f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}';"
           f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{DB_PASSWORD}';"
           f"GRANT ALL PRIVILEGES ON *.* TO '{DB_USER}'@'127.0.0.1' WITH GRANT OPTION;"
           f"GRANT ALL PRIVILEGES ON *.* TO '{DB_USER}'@'localhost' WITH GRANT OPTION;")
    deadline = time.monotonic() + 60
    while (done := subprocess.run([mariadb, f"--socket={sock}", "-uroot", "-e", sql], capture_output=True,
                                  text=True)).returncode != 0:
        if time.monotonic() > deadline:
            die(f"could not create database {DB_NAME} and user {DB_USER} as root over {sock}: "
                f"{done.stderr.strip()[-2000:]}; see {log}")
        time.sleep(0.5)


def second_mariadb_up() -> dict:
    """A second MariaDB server (``.stack/mariadb-2``, next port): store and sink on two servers."""
    return mariadb_up(SECOND_MARIADB, SECOND_MARIADB_PORT)


def second_mariadb_down() -> None:
    stop("second MariaDB", SECOND_MARIADB / "mariadb.pid")


#: What Debezium's MariaDB connector needs of the server: a binlog of whole rows, and a server id of its own (the
#: connector joins as a replica with another). The stack's ``eo`` user has every privilege (the connector's user
#: needs SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE and REPLICATION CLIENT, or BINLOG MONITOR on MariaDB).
BINLOG_OPTIONS = ("--log-bin=binlog", "--binlog-format=ROW", "--binlog-row-image=FULL", "--server-id=1",
                  "--expire-logs-days=1")


def binlog_mariadb_up() -> dict:
    """A MariaDB server that writes a row-based binlog (``.stack/mariadb-binlog``, two ports above the stack's):
    a change-data-capture source."""
    return mariadb_up(BINLOG_MARIADB, BINLOG_MARIADB_PORT, BINLOG_OPTIONS)


def binlog_mariadb_down() -> None:
    stop("binlog MariaDB", BINLOG_MARIADB / "mariadb.pid")

