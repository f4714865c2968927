"""``airflow eo`` as people run it: Airflow's command line in a child process (forked from the tests' fork server:
:mod:`tests.support.fork_server`), with this test session's connections."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from airflow_eo.core.failpoints import FAILPOINTS_ENV
from tests.support import fork_server


def eo(*args: str) -> subprocess.CompletedProcess:
    """``airflow eo ARGS`` in a child process, with this test session's connections (environment)."""
    env = {k: v for k, v in os.environ.items() if k != FAILPOINTS_ENV}
    return fork_server.run(["-m", "airflow", "eo", *args], env, timeout=120)


def eo_json(*args: str) -> Any:
    done = eo(*args, "-o", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)
