"""``airflow eo`` as people run it: the venv's ``airflow`` in a child process, with this test session's connections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_eo.core.failpoints import FAILPOINTS_ENV

AIRFLOW = str(Path(sys.executable).parent / "airflow")


def eo(*args: str) -> subprocess.CompletedProcess:
    """``airflow eo ARGS`` in a child process, with this test session's connections (environment)."""
    env = {k: v for k, v in os.environ.items() if k != FAILPOINTS_ENV}
    return subprocess.run([AIRFLOW, "eo", *args], capture_output=True, text=True, timeout=120, env=env)


def eo_json(*args: str) -> Any:
    done = eo(*args, "-o", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)
