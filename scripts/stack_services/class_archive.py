"""The Spark driver's class-data-sharing archive, made by ``up``."""

from __future__ import annotations

import subprocess
import sys

from stack_services.layout import CACHE


def spark_class_archive() -> None:
    """The Spark driver's class-data-sharing archive (:mod:`airflow_eo.spark.class_archive`), made now rather than
    in the background of the first batch: every driver started after it (each DAG run's, each test's) starts ~3 s
    sooner. Once per pyspark and Java, ~15 s; a failure only costs the speed-up."""
    done = subprocess.run([sys.executable, "-m", "airflow_eo.spark.class_archive", "--cache", str(CACHE)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    said = (done.stdout.strip().splitlines() or [f"not made (exit {done.returncode})"])[-1]
    print(f"stack: {said}")
