"""Crash points for the exactly-once tests.

When ``AIRFLOW_EO_FAULT`` names one of ``POINTS``, the process is killed with SIGKILL
there (not an exception: nothing gets to clean up), exactly as a machine or OOM kill would.
Production runs never set the variable.
"""

from __future__ import annotations

import os
import signal
import tempfile

FAULT_ENV = "AIRFLOW_EO_FAULT"

POINTS = (
    "after_plan",  # batch row written, no data read
    "during_write",  # executors are writing (killed from inside a Spark task)
    "after_prepare",  # XA branches prepared and recorded, before the commit point
    "after_commit_point",  # store committed, before XA COMMIT
    "between_xa_commits",  # one XA branch committed, others not
    # Kafka transactional sink
    "before_produce",  # transaction begun, nothing produced
    "mid_produce",  # part of the output produced into the open transaction
    "after_last_send",  # all output flushed, offsets not sent, not committed
    "after_kafka_commit",  # Kafka committed output + offsets, the store did not mirror it yet
)
# Not a kill: the first attempt of each Spark write task raises after XA PREPARE, so Spark
# retries the task while the failed attempt's prepared branch still holds its row locks.
TASK_FAILURE = "fail_task_after_prepare"


def fault_requested(point: str) -> bool:
    return os.environ.get(FAULT_ENV) == point


def crash_if(point: str, pid: int | None = None) -> None:
    """SIGKILL ``pid`` (default: this process) if the fault ``point`` is requested."""
    if fault_requested(point):
        os.kill(pid or os.getpid(), signal.SIGKILL)


def first_failure(key: str) -> bool:
    """True the first time ``key`` is seen on this machine (a marker file), so a fault fires once."""
    folder = os.environ.get("AIRFLOW_EO_FAULT_DIR", tempfile.gettempdir())
    marker = os.path.join(folder, f"airflow_eo-fault-{key.replace('/', '_').replace(':', '_')}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
