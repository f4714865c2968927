"""Crash points for the exactly-once tests.

When ``AIRFLOW_EO_FAULT`` names one of ``POINTS``, the process is killed with SIGKILL
there (not an exception: nothing gets to clean up), exactly as a machine or OOM kill would.
With ``AIRFLOW_EO_FAULT_KILL`` naming a pid file, the process in it is killed there instead, once
(the database or the broker crashing at that step), and the attempt carries on into the dead service.
Production runs never set the variables.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

FAULT_ENV = "AIRFLOW_EO_FAULT"
FAULT_DIR_ENV = "AIRFLOW_EO_FAULT_DIR"  # where faults that fire once keep their markers
FAULT_KILL_ENV = "AIRFLOW_EO_FAULT_KILL"  # pid file of the process to kill at the point instead of ours

POINTS = (
    "after_plan",  # batch row written, no data read
    "during_write",  # executors are writing (killed from inside a Spark task)
    "after_prepare",  # XA branches prepared and recorded, before the commit point
    "in_store_commit",  # inside the store's commit transaction, before its COMMIT
    "after_commit_point",  # store committed, before XA COMMIT
    "between_xa_commits",  # one XA branch committed, others not
    # Kafka transactional sink
    "before_produce",  # transaction begun, nothing produced
    "mid_produce",  # part of the output produced into the open transaction
    "after_last_send",  # all output flushed, offsets not sent, not committed
    "after_kafka_commit",  # Kafka committed output + offsets, the store did not mirror it yet
)
# Not a kill: the first upsert writer to get here blocks (no lock held) until the test releases it,
# as an executor that outlives its SIGKILLed driver would write late.
HOLD_WRITE = "hold_write"
# The first Spark task to write SIGKILLs its executor's JVM (a lost executor: Spark retries the
# task on another one). Only on a cluster, where executors are JVMs of their own.
KILL_EXECUTOR = "kill_executor"
# Not a kill: the first attempt of each Spark write task raises after XA PREPARE, so Spark
# retries the task while the failed attempt's prepared branch still holds its row locks.
TASK_FAILURE = "fail_task_after_prepare"


def fault_requested(point: str) -> bool:
    return os.environ.get(FAULT_ENV) == point


def crash_if(point: str, pid: int | None = None) -> None:
    """SIGKILL ``pid`` (default: this process) if the fault ``point`` is requested; with
    ``AIRFLOW_EO_FAULT_KILL`` set, SIGKILL the process of that pid file instead, the first time."""
    if not fault_requested(point):
        return
    target = os.environ.get(FAULT_KILL_ENV)
    if not target:
        os.kill(pid or os.getpid(), signal.SIGKILL)
    elif first_failure(f"kill-{point}"):
        kill_and_wait(int(open(target).read().strip()))


def kill_and_wait(pid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL ``pid`` and wait until it is gone: its connections are closed when this returns."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running(pid):
        time.sleep(0.02)


def running(pid: int) -> bool:
    """True while any thread of ``pid`` runs. A killed process its parent has not reaped yet (a zombie)
    does not; its main thread turns zombie before the others are gone and its sockets closed."""
    # A process being reaped answers a read of its /proc entries with ESRCH (ProcessLookupError).
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:  # no /proc (not Linux): ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            continue
    return False


def fault_dir() -> str:
    return os.environ.get(FAULT_DIR_ENV, tempfile.gettempdir())


def executor_env() -> dict[str, str]:
    """The requested fault as Spark conf for the executors (a cluster's executors do not inherit
    the driver's environment). Empty in production."""
    return {f"spark.executorEnv.{name}": os.environ[name] for name in (FAULT_ENV, FAULT_DIR_ENV, FAULT_KILL_ENV)
            if name in os.environ}


def kill_executor_if_requested() -> None:
    """SIGKILL the executor JVM this Spark task runs in, the first time (see ``KILL_EXECUTOR``)."""
    if not fault_requested(KILL_EXECUTOR) or not first_failure(KILL_EXECUTOR):
        return
    pid = os.getpid()
    while pid > 1:  # up from the Python worker to the JVM that forked its daemon
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"CoarseGrainedExecutorBackend" in cmdline.read():
                os.kill(pid, signal.SIGKILL)
                return
        with open(f"/proc/{pid}/status") as status:
            pid = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
    raise RuntimeError("kill_executor fault: this Spark task does not run in an executor JVM of its own")


def hold_if(point: str, timeout_s: float = 600.0) -> None:
    """Block the first caller of ``point`` (if requested) until a ``release-<point>`` file appears.

    It announces itself with a ``held-<point>`` file in :func:`fault_dir`.
    """
    if not fault_requested(point) or not first_failure(f"hold-{point}"):
        return
    held, release = (os.path.join(fault_dir(), f"airflow_eo-{what}-{point}") for what in ("held", "release"))
    open(held, "w").close()
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)


def first_failure(key: str) -> bool:
    """True the first time ``key`` is seen on this machine (a marker file), so a fault fires once."""
    marker = os.path.join(fault_dir(), f"airflow_eo-fault-{key.replace('/', '_').replace(':', '_')}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
