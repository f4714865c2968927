"""The local Spark cluster of ``scripts/spark_cluster.py`` (``make spark-cluster``), once for the tests in this package.

The fixture starts the cluster unless it already runs (then it reuses it and leaves it running), exports
``.stack/spark/env`` into ``os.environ`` while they run and restores the environment at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lanes import read_env_file
from tests.support.spark_cluster import SPARK_DIR, SparkCluster

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "scripts" / "spark_cluster.py"
PARTS = ("master", "worker1", "worker2", "connect", "connect-token")


def _running_parts() -> list[str]:
    running = []
    for name in PARTS:
        try:
            os.kill(int((SPARK_DIR / f"{name}.pid").read_text().strip()), 0)
            running.append(name)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            pass
    return running


def _run_script(command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), command], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


# Package scope: the cluster's JVMs (master, worker, two Connect servers and their executors) stop
# when tests/cluster ends instead of weighing on the rest of the suite.
@pytest.fixture(scope="package")
def spark_cluster() -> Iterator[SparkCluster]:
    # Anything already running belongs to someone else (make spark-cluster): reuse it, never stop it.
    started_here = not _running_parts()
    started = time.monotonic()
    done = _run_script("up", timeout=420)
    up_seconds = time.monotonic() - started
    if done.returncode != 0:
        if started_here:
            _run_script("down", timeout=120)
        output = done.stdout + done.stderr  # the reason is in the first line, the log tail after it
        pytest.fail(f"spark_cluster.py up failed (exit {done.returncode}):\n{output[:1500]}\n...\n{output[-3000:]}")
    values = read_env_file(SPARK_DIR / "env")
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield SparkCluster(
            master=values["EO_SPARK_MASTER"], connect=values["EO_SPARK_CONNECT"],
            connect_token_url=values["EO_SPARK_CONNECT_TOKEN_URL"], token=values["EO_SPARK_CONNECT_TOKEN"],
            worker_python=values["EO_SPARK_WORKER_PYTHON"], started_here=started_here, up_seconds=up_seconds,
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if started_here:
            _run_script("down", timeout=180)
