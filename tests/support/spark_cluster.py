"""The local Spark cluster of ``scripts/spark_cluster.py``: where it keeps its files, and what the tests know of it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO

SPARK_DIR = Path(os.environ.get("EO_STACK_DIR", REPO / ".stack")) / "spark"


@dataclass(frozen=True)
class SparkCluster:
    master: str  # spark://127.0.0.1:27077
    connect: str  # sc://127.0.0.1:25002
    connect_token_url: str  # sc://localhost:25003 (a token needs the host spelled "localhost": see spark_cluster.py)
    token: str
    worker_python: str  # the executors' Python (no airflow_eo, no Airflow)
    started_here: bool  # this test session started the cluster (and stops it at the end)
    up_seconds: float

    def token_url(self, token: str | None) -> str:
        return f"{self.connect_token_url}/;token={token}" if token else self.connect_token_url
