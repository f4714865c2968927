"""The stack from a clone in a folder closed to other users (a home directory, a ``mktemp -d`` folder).

As root, the stack's PostgreSQL runs as Debian's ``postgres`` user (the server refuses root), which cannot enter
such a folder: every path the server is given must be one it can reach. This starts the stack's PostgreSQL with a
``.stack`` under a mode-0700 folder (its own ports), connects, SIGKILLs and restarts it on the same data, stops it
and cleans up, through ``scripts/stack.py`` as ``make`` runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_eo.core.failpoints import running

REPO = Path(__file__).resolve().parents[2]
STACK_SCRIPT = REPO / "scripts" / "stack.py"


def free_port_below_ephemeral(start: int = 25470, stop: int = 25600) -> int:
    """A free loopback port below the kernel's ephemeral range (a restart may find an ephemeral one taken)."""
    for port in range(start, stop):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise AssertionError(f"no free port in {start}..{stop}")


@pytest.fixture
def private_clone() -> Iterator[tuple[Path, dict[str, str]]]:
    """A ``.stack`` folder inside a folder of mode 0700 (as ``mktemp -d`` makes it), and the environment that
    points ``scripts/stack.py`` at it on ports of its own."""
    closed = Path(tempfile.mkdtemp(prefix="eo-private-"))
    assert os.stat(closed).st_mode & 0o777 == 0o700
    stack_dir = closed / "clone" / ".stack"
    env = {**os.environ, "EO_STACK_DIR": str(stack_dir), "EO_STACK_PG_PORT": str(free_port_below_ephemeral())}
    env.pop("EO_PG_HOST", None)
    try:
        yield stack_dir, env
    finally:
        subprocess.run([sys.executable, str(STACK_SCRIPT), "clean"], env=env, capture_output=True, timeout=120)
        subprocess.run(["rm", "-rf", str(closed)], check=False)


def stack(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, str(STACK_SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"stack.py {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def connect(env: dict[str, str]) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=int(env["EO_STACK_PG_PORT"]), user="eo", password="eo",
                           dbname="airflow_eo", connect_timeout=5, autocommit=True)


def server_pid(stack_dir: Path) -> int:
    return int((stack_dir / "postgres" / "postgres.pid").read_text())


def test_the_stacks_postgres_runs_restarts_and_stops_from_a_clone_in_a_closed_folder(private_clone):
    stack_dir, env = private_clone
    stack(env, "postgres", "up")
    with connect(env) as conn:
        conn.execute("CREATE TABLE survives (n INT)")
        conn.execute("INSERT INTO survives VALUES (42)")
        # Two-phase commit is on (the two-phase sink needs it) and the server is the one we started.
        assert conn.execute("SHOW max_prepared_transactions").fetchone() == ("100",)
        data_directory = conn.execute("SHOW data_directory").fetchone()[0]
    if os.geteuid() == 0:
        # The server's user reaches every path it was given: none of them lies under the closed folder.
        assert not Path(data_directory).is_relative_to(stack_dir.parent.parent), data_directory
        assert (stack_dir / "postgres" / "root").is_symlink()

    first = server_pid(stack_dir)
    stack(env, "restart", "postgres")  # SIGKILL of the process group, then a start on the same data
    assert not running(first)
    with connect(env) as conn:
        assert conn.execute("SELECT n FROM survives").fetchall() == [(42,)]

    second = server_pid(stack_dir)
    stack(env, "down")
    assert not running(second), "make down left the server running"
    with pytest.raises(psycopg.OperationalError):
        connect(env)
    stack(env, "clean")
    assert not stack_dir.exists()
    assert not Path(data_directory).exists(), "clean left the data directory outside .stack behind"
