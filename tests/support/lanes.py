"""Lanes: ``make test`` runs the suite in two pytest-xdist workers, each against a stack of its own.

A test here may use fixed names (the example DAGs' topics, tables and pipelines), reset them, or SIGKILL and
restart the stack's MariaDB, PostgreSQL or Kafka. Two such tests at once on one stack would meet; on two stacks
they never do. Worker ``gw0`` uses the stack of ``make up`` (``.stack``); worker ``gwN`` the stack of lane N+1,
``.stack/lane-<N+1>`` on ports of its own (the Makefile's ``LANE_2``), whose ``env`` file it loads over the
environment before anything reads it (Airflow reads ``AIRFLOW_HOME`` once, at import). Nothing here imports
Airflow.

A test file runs whole on one worker (its module fixtures start once); files that need a resource only one lane can
hold at a time (the Spark cluster's and the Airflow deployment's fixed ports) share a group (:data:`SHARED_GROUPS`),
so they run one after the other on one worker (tests/conftest.py's ``pytest_xdist_make_scheduler``).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from tests.support import REPO

#: Test folders whose files take fixed ports outside a lane's stack: one group each, run on one worker.
SHARED_GROUPS = {"tests/cluster": "spark_cluster", "tests/scheduler": "airflow_deployment",
                 "tests/ui": "airflow_deployment"}


def read_env_file(path: Path) -> dict[str, str]:
    """The ``export NAME='value'`` lines of an env file (``.stack/env``, ``.stack/spark/env``) as a dict."""
    values = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            values[key] = value
    return values


def lane_number() -> int:
    """This process's lane: 1 outside xdist and in worker ``gw0``, N+1 in worker ``gwN``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw")) + 1


#: Lane 1's stack folder, as the environment said before a lane's ``env`` (which names its own) was loaded.
FIRST_STACK = Path(os.environ.get("EO_STACK_DIR") or REPO / ".stack")


def lane_env_file(lane: int) -> Path:
    """Where lane ``lane``'s stack (``lane >= 2``) writes its ``env``: beside lane 1's own ``.stack`` files."""
    return FIRST_STACK / f"lane-{lane}" / "env"


def use_this_workers_lane() -> None:
    """Point this process (and every child it starts) at its lane's stack; lane 1 keeps the environment as is."""
    lane = lane_number()
    if lane == 1:
        return
    env_file = lane_env_file(lane)
    if not env_file.exists():
        raise SystemExit(f"pytest-xdist worker of lane {lane} has no stack: {env_file} is missing. Run the suite "
                         f"with `make test` (it starts one stack per lane, TEST_LANES), or without -n.")
    os.environ.update(read_env_file(env_file))


def group_of(test_path: str) -> str:
    """The scheduling group of a test file (a path relative to the repository): its shared group, else itself."""
    for folder, group in SHARED_GROUPS.items():
        if test_path.startswith(folder + "/"):
            return group
    return test_path
