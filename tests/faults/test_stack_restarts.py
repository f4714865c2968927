"""The stack restarts a killed PostgreSQL whose zombie another process holds.

The soak runs as a child of the test run; when an earlier test restarted PostgreSQL from the test run itself,
the soak's SIGKILL leaves the postmaster a zombie only the test run can reap, and the zombie's pid still
answers ``kill(pid, 0)``, which a new postmaster takes for a live server (CI failed on this once).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import psycopg

REPO = Path(__file__).resolve().parents[2]


def test_postgres_killed_by_another_process_than_its_parent_comes_back(stack: ModuleType, postgres_kwargs):
    stack.restart("postgres")  # this process is now the postmaster's parent
    first = int(stack.PID_FILES["postgres"].read_text())
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "stack.py"), "restart", "postgres"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(stack.PID_FILES["postgres"].read_text()) != first
    with psycopg.connect(**postgres_kwargs) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
