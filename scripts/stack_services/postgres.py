"""PostgreSQL: the stack's server (``.stack/postgres``; as root in a closed folder, its data in a folder of the
``postgres`` user's under /var/tmp), a second one for the fault tests (``.stack/postgres-2``, next port), or the
user's server named by ``EO_PG_HOST`` (then nothing is started)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_eo.core.failpoints import running
from stack_services.layout import (
    DB_NAME,
    DB_PASSWORD,
    DB_USER,
    POSTGRES_HOME,
    POSTGRES_PORT,
    SECOND_POSTGRES,
    SECOND_POSTGRES_PORT,
)
from stack_services.processes import die, pid_alive, port_open, spawn, stop, wait_for

# Settings of the stack's server: two-phase commit on (0 by default), room for a test suite's connections; the
# data only has to survive a SIGKILL of the server (not of the machine), so fsync buys nothing here. Logical
# decoding for Debezium (`pgoutput`): wal_level=logical, and room for a replication slot and a WAL sender per
# connector a test suite registers (10 of each by default).
POSTGRES_SETTINGS = {"listen_addresses": "127.0.0.1", "max_prepared_transactions": "100", "max_connections": "300",
                     "fsync": "off", "full_page_writes": "off", "log_min_messages": "warning",
                     "wal_level": "logical", "max_replication_slots": "20", "max_wal_senders": "20"}


def postgres_settings() -> dict:
    if os.environ.get("EO_PG_HOST"):
        return {
            "host": os.environ["EO_PG_HOST"],
            "port": int(os.environ.get("EO_PG_PORT", "5432")),
            "user": os.environ.get("EO_PG_USER", "postgres"),
            "password": os.environ.get("EO_PG_PASSWORD", ""),
            "database": os.environ.get("EO_PG_DATABASE", DB_NAME),
            "external": True,
        }
    return {"host": "127.0.0.1", "port": POSTGRES_PORT, "user": DB_USER, "password": DB_PASSWORD,
            "database": DB_NAME, "external": False}


def postgres_ready(settings: dict) -> bool:
    import psycopg

    try:
        psycopg.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                        password=settings["password"], dbname=settings["database"], connect_timeout=2).close()
        return True
    except psycopg.Error:
        return False


def postgres_bin_dir() -> Path:
    """Debian's PostgreSQL server programs (``initdb``, ``postgres``, ``psql``), the newest installed."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    installed = [p for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.parent.parent.name.isdigit()]
    if not installed:
        die("PostgreSQL's 'initdb' not found: install PostgreSQL (Debian: apt-get update && apt-get install "
            "postgresql), or set EO_PG_HOST to use your server")
    return max(installed, key=lambda p: int(p.parent.parent.name)).parent


def postgres_user() -> dict[str, Any]:
    """As root, the server runs as Debian's ``postgres`` user (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        die("running as root needs the 'postgres' OS user that Debian's postgresql package creates")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def postgres_root(home: Path, as_user: dict[str, Any]) -> Path:
    """The folder of the server's data directory (``data``) and socket, and its working directory.

    ``home`` itself when the server's OS user can reach it. When it cannot (root's clone in a folder closed to
    others, like ``/root`` or a ``mktemp -d`` folder: the server runs as ``postgres``), a folder of that user's
    under /var/tmp, which ``home/root`` links to; every path the server is given is that folder's, never one
    through ``home``. ``clean`` removes it with the stack.
    """
    link = home / "root"
    if link.is_symlink():
        return link.resolve()
    if (home / "data").is_symlink():  # the layout of earlier releases: only the data directory lived elsewhere
        return (home / "data").resolve().parent
    if not as_user or reaches(home, as_user):
        return home
    elsewhere = Path("/var/tmp") / f"airflow-eo-postgres-{uuid.uuid5(uuid.NAMESPACE_URL, str(home)).hex[:12]}"
    if elsewhere.exists():  # a stack once at this path was removed without `clean`: its data is not ours
        shutil.rmtree(elsewhere)
    elsewhere.mkdir(mode=0o700, parents=True)
    os.chown(elsewhere, as_user["user"], as_user["group"])
    link.symlink_to(elsewhere)
    return elsewhere


def reaches(folder: Path, as_user: dict[str, Any]) -> bool:
    """Whether ``as_user`` can enter and write ``folder`` (every parent searchable): asked as that user, so that
    groups and ACLs count as the kernel counts them."""
    return subprocess.run(["test", "-x", str(folder), "-a", "-w", str(folder)], **as_user).returncode == 0


def postgres_roots() -> list[Path]:
    """The folders outside ``.stack`` that the stack's PostgreSQL servers keep their data in (see
    :func:`postgres_root`)."""
    links = [home / "root" for home in (POSTGRES_HOME, SECOND_POSTGRES)] + [
        home / "data" for home in (POSTGRES_HOME, SECOND_POSTGRES)]
    return [link.resolve() if link.name == "root" else link.resolve().parent for link in links if link.is_symlink()]


def wait_until_reaped(postmaster_pid: Path, socket_lock: Path, log: Path, timeout: float = 30) -> None:
    """Wait until a killed postmaster is dead, and clear its lock files if only its zombie is left.

    A new postmaster refuses to start while the pid in ``postmaster.pid`` answers ``kill(pid, 0)``, which an
    unreaped zombie does. We reap it if it is our child; a zombie of another process (e.g. the test run that
    started the server, killed by a soak it runs) may stay for as long as that process lives, so once the
    pid runs no thread any more its lock files (the data directory's and the socket's, both holding its pid)
    are stale, and PostgreSQL's documented fix is to remove them."""
    try:
        pid = int(postmaster_pid.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass  # another user's pid
        if not running(pid):  # a zombie nobody here can reap
            postmaster_pid.unlink(missing_ok=True)
            socket_lock.unlink(missing_ok=True)
            return
        time.sleep(0.05)
    die(f"the previous PostgreSQL server (pid {pid}) is still there after {timeout:.0f}s; see {log}")


def postgres_up(home: Path | None = None, port: int = POSTGRES_PORT) -> dict:
    """Start (or find running) the PostgreSQL server of ``home`` on ``port`` (default: the stack's, or the user's
    server of ``EO_PG_HOST``): its own data under ``home``."""
    settings = postgres_settings() if home is None else {
        "host": "127.0.0.1", "port": port, "user": DB_USER, "password": DB_PASSWORD, "database": DB_NAME,
        "external": False}
    if settings["external"]:
        print(f"stack: using your PostgreSQL at {settings['host']}:{settings['port']} (EO_PG_HOST)")
        if not postgres_ready(settings):
            die(f"cannot connect to PostgreSQL at {settings['host']}:{settings['port']} as {settings['user']} "
                f"(database {settings['database']}); check EO_PG_* settings")
        return settings
    home = home or POSTGRES_HOME
    pid_file, log = home / "postgres.pid", home / "postgres.log"
    if pid_alive(pid_file):
        wait_for("PostgreSQL", lambda: postgres_ready(settings), 60, log)
        print(f"stack: PostgreSQL already running at 127.0.0.1:{port}")
        return settings
    if port_open(port):
        die(f"port {port} is taken by another process; set EO_STACK_PG_PORT, or EO_PG_HOST to use that server")
    bin_dir, as_user = postgres_bin_dir(), postgres_user()
    home.mkdir(parents=True, exist_ok=True)
    if as_user:
        os.chown(home, as_user["user"], as_user["group"])
    # The server's OS user gets only paths under ``root`` (its working directory included); our own files (the
    # pid file, the log the server writes through an inherited descriptor) stay in ``home``.
    root = postgres_root(home, as_user)
    data = root / "data"
    wait_until_reaped(data / "postmaster.pid", root / f".s.PGSQL.{port}.lock", log)
    fresh = not (data / "PG_VERSION").exists()
    if fresh:
        done = subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
                               "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
                              capture_output=True, text=True, cwd=root, **as_user)
        if done.returncode != 0:
            die(f"initdb failed:\n{(done.stdout + done.stderr)[-3000:]}")
    server = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root)]
    for name, value in POSTGRES_SETTINGS.items():
        server += ["-c", f"{name}={value}"]
    spawn(server, log, pid_file, cwd=root, **as_user)
    psql = [str(bin_dir / "psql"), "-h", str(root), "-p", str(port), "-U", "postgres", "-v", "ON_ERROR_STOP=1"]
    def answers() -> bool:
        if not pid_alive(pid_file):
            die(f"PostgreSQL exited while starting; last log lines:\n{log.read_text(errors='replace')[-3000:]}")
        return subprocess.run([*psql, "-c", "SELECT 1"], capture_output=True, cwd=root, **as_user).returncode == 0

    wait_for("PostgreSQL", answers, 120, log)
    if fresh:
        sql = (f"CREATE ROLE {DB_USER} LOGIN SUPERUSER REPLICATION PASSWORD '{DB_PASSWORD}';"
               f"CREATE DATABASE {DB_NAME} OWNER {DB_USER};")
        for statement in sql.split(";")[:-1]:
            done = subprocess.run([*psql, "-c", statement], capture_output=True, text=True, cwd=root, **as_user)
            if done.returncode != 0:
                die(f"could not set up PostgreSQL ({statement.split(' PASSWORD')[0]}): {done.stderr}")
    wait_for("PostgreSQL", lambda: postgres_ready(settings), 60, log)
    print(f"stack: PostgreSQL ready at 127.0.0.1:{port} (database {DB_NAME})")
    return settings


def second_postgres_up() -> dict:
    """A second PostgreSQL server (``.stack/postgres-2``, next port, the first's settings): store and sink on two
    servers. Also starts it again after a SIGKILL (:func:`postgres_up` waits until the killed one is reaped)."""
    return postgres_up(SECOND_POSTGRES, SECOND_POSTGRES_PORT)


def second_postgres_down() -> None:
    stop("second PostgreSQL", SECOND_POSTGRES / "postgres.pid", signal.SIGINT)

