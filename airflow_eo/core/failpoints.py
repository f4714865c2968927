"""Failpoints: named places in the code where a test makes the process crash, block or fail (after tikv's fail-rs).

``failpoint(name)`` does nothing unless the one switch, the environment variable ``AIRFLOW_EO_FAILPOINTS``,
arms ``name``. Production runs never set it. The switch holds ``name=actions`` entries separated by ``;``::

    AIRFLOW_EO_FAILPOINTS="during_write=kill(driver);after_task_prepare=1*panic"

``actions`` is ``[N*]action[->action...]``: with ``N*`` the point fires only its first N times on this machine
(markers in ``AIRFLOW_EO_FAILPOINT_DIR``); the actions then run one after the other:

``kill``            SIGKILL this process (the one the harness started: a driver, or the server hosting the point).
``kill(<role>)``    SIGKILL the process the harness registered as ``<role>`` (:func:`register_process` wrote its pid
                    to ``<dir>/<role>.pid``) with its descendants (unless this process is one), and wait until
                    they are gone. Nothing else is ever killed.
``kill_executor``   SIGKILL the Spark executor JVM this task runs in (a cluster's executor, started by the harness).
``pause``           block until ``<dir>/release-<name>`` exists; announce it with ``<dir>/held-<name>``.
``panic``           raise :class:`FailpointError` (a task failure, not a crash).
``sleep(<ms>)``     wait (lets buffered output reach its server before a kill).
``off``             nothing.

:data:`POINTS` is the list of every failpoint in the code, with where it is and the action the crash tests use.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from dataclasses import dataclass

FAILPOINTS_ENV = "AIRFLOW_EO_FAILPOINTS"
FAILPOINT_DIR_ENV = "AIRFLOW_EO_FAILPOINT_DIR"  # counts' markers, pause files, registered pids


@dataclass(frozen=True)
class Point:
    """One failpoint: where it is, and the action that kills the process there (None: not a crash point)."""

    where: str
    kill: str | None = "kill"


#: Every failpoint, in protocol order. ``kill`` is the action the crash tests and the soak arm it with.
POINTS: dict[str, Point] = {
    "after_plan": Point("the batch row is written, no data read"),
    "during_write": Point("Spark tasks are writing, nothing committed or prepared (fires in a task)", "kill(driver)"),
    "after_prepare": Point("XA branches prepared and recorded, before the commit point"),
    "in_store_commit": Point("inside the store's commit transaction, before its COMMIT"),
    "after_commit_point": Point("the store committed, before XA COMMIT"),
    "between_xa_commits": Point("one XA branch committed, the others not"),
    "before_produce": Point("Kafka transaction begun, nothing produced"),
    "mid_produce": Point("part of the output produced into the open Kafka transaction", "sleep(1000)->kill"),
    "after_last_send": Point("all output flushed, offsets not sent, not committed"),
    "after_kafka_commit": Point("Kafka committed output and offsets; the store did not mirror it yet"),
    "before_table_commit": Point("the (Delta, Iceberg) table exists, the batch's commit not made (Iceberg: its "
                                 "snapshot staged, not published)"),
    "after_table_commit": Point("the (Delta, Iceberg) table committed the batch; the store did not mirror it yet"),
    "task_write": Point("a Spark write task holds its connection and starts writing (pause, kill_executor)", None),
    "after_task_prepare": Point("a Spark task prepared its XA branch, before it reports (panic: Spark retries it)",
                                None),
    "after_change_positions": Point("changes: the batch's output is written and the positions of its changes are "
                                    "prepared (two-phase) or committed (upsert) in the change-position table"),
    "after_seen_ids": Point("dedup_key: the batch's first sightings are prepared (two-phase) or committed (upsert) in "
                            "the seen-id table; its output is written too when the write tasks marked the copies, "
                            "else not yet"),
    "after_task_dead_letters": Point("a Spark task prepared (XA, PostgreSQL two-phase) or committed (upsert) the "
                                     "bad records it found, before it reports", "kill(driver)"),
}

_ENTRY = re.compile(r"^(?:(?P<count>\d+)\*)?(?P<actions>.+)$")
_ACTION = re.compile(r"^(?P<name>kill|kill_executor|pause|panic|sleep|off)(?:\((?P<arg>[A-Za-z0-9_.-]+)\))?$")


class FailpointError(RuntimeError):
    """Raised by a ``panic`` failpoint."""


def failpoint(name: str, scope: str = "") -> None:
    """Run the actions the switch arms ``name`` with; nothing when it does not (production).

    ``scope`` keeps separate counts for one point (e.g. one per Spark partition: the first attempt of each task).
    """
    switch = os.environ.get(FAILPOINTS_ENV)
    if not switch:
        return
    armed = parse(switch).get(name)
    if armed is None:
        return
    count, actions = armed
    if count is not None and not _take(f"{name}-{scope}" if scope else name, count):
        return
    for action, arg in actions:
        _run(name, action, arg)


def parse(switch: str) -> dict[str, tuple[int | None, list[tuple[str, str | None]]]]:
    """``name -> (count, [(action, arg), ...])``; a clear error for an entry that is not ``name=[N*]action``."""
    armed: dict[str, tuple[int | None, list[tuple[str, str | None]]]] = {}
    for entry in filter(None, (e.strip() for e in switch.split(";"))):
        name, _, spec = entry.partition("=")
        if name not in POINTS:
            raise ValueError(f"{FAILPOINTS_ENV}: unknown failpoint {name!r} (known: {', '.join(POINTS)})")
        match = _ENTRY.match(spec.strip())
        actions = [_ACTION.match(a.strip()) for a in match.group("actions").split("->")] if match else [None]
        if match is None or any(a is None for a in actions):
            raise ValueError(f"{FAILPOINTS_ENV}: {entry!r} is not name=[N*]action[->action] "
                             "(kill, kill(<role>), kill_executor, pause, panic, sleep(<ms>), off)")
        armed[name] = (int(match.group("count")) if match.group("count") else None,
                       [(a.group("name"), a.group("arg")) for a in actions if a is not None])
    return armed


def arm(*entries: str, directory: str) -> dict[str, str]:
    """The environment that arms ``entries`` (``"name=action"``, or a bare name: its crash action) for a child."""
    specs = [e if "=" in e else f"{e}={POINTS[e].kill}" for e in entries]
    return {FAILPOINTS_ENV: ";".join(specs), FAILPOINT_DIR_ENV: directory}


def register_process(directory: str, role: str, pid: int) -> None:
    """Name a process the harness started, for ``kill(<role>)``."""
    path = os.path.join(directory, f"{role}.pid")
    with open(f"{path}.tmp", "w") as out:
        out.write(str(pid))
    os.replace(f"{path}.tmp", path)  # whole or absent, never half-written


def executor_env() -> dict[str, str]:
    """The switch as Spark conf for the executors (a cluster's executors do not inherit the driver's environment).
    Empty in production."""
    return {f"spark.executorEnv.{name}": os.environ[name] for name in (FAILPOINTS_ENV, FAILPOINT_DIR_ENV)
            if name in os.environ}


def failpoint_dir() -> str:
    return os.environ.get(FAILPOINT_DIR_ENV, tempfile.gettempdir())


def kill_and_wait(pid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL ``pid`` and its descendants, as a crash of their machine would, and wait until they are gone: their
    connections are closed when this returns.

    A server is its process tree: a PostgreSQL backend outlives a killed postmaster for a moment (in a session of its
    own, out of the postmaster's process group) and may still commit what its client sends meanwhile. A process of
    the tree that kills its own root (a Spark task of a local driver) kills the root alone: the rest dies as it does
    after its root's crash (PySpark's JVM exits when its driver's pipe closes), and the killer never goes on.
    """
    os.kill(pid, signal.SIGSTOP)  # forks no child while its tree is read
    below = _descendants(pid)
    victims = [pid] if os.getpid() in below else [pid, *below]
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(running(victim) for victim in victims):
        time.sleep(0.02)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


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


def _run(name: str, action: str, arg: str | None) -> None:
    if action == "kill" and arg is None:
        _trace(name, f"kill pid {os.getpid()} (itself)")
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "kill":
        target = _registered(str(arg))
        _trace(name, f"kill({arg}) pid {target}")
        kill_and_wait(target)
        _trace(name, f"kill({arg}) pid {target}: gone")
    elif action == "kill_executor":
        _kill_executor()
    elif action == "pause":
        _pause(name)
    elif action == "panic":
        raise FailpointError(f"failpoint {name}: injected failure")
    elif action == "sleep":
        time.sleep(int(arg or 0) / 1000)


def fired(directory: str) -> list[str]:
    """What the armed points did, one line each (time, point, action, the process that ran it): a test shows it
    when a fault did not land where it expected."""
    try:
        with open(os.path.join(directory, "fired.log")) as log:
            return log.read().splitlines()
    except FileNotFoundError:
        return []


def _trace(name: str, what: str) -> None:
    if FAILPOINT_DIR_ENV not in os.environ:
        return
    line = f"{time.time():.3f} {name}: {what}, run by pid {os.getpid()}\n"
    fd = os.open(os.path.join(failpoint_dir(), "fired.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())  # one write of an O_APPEND file: lines of several processes never interleave
    finally:
        os.close(fd)


def _registered(role: str, timeout_s: float = 30.0) -> int:
    """The pid the harness registered as ``role`` (waits for it: the harness writes it just after the start)."""
    path = os.path.join(failpoint_dir(), f"{role}.pid")
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise FailpointError(f"failpoint kill({role}): no process registered as {role} in {path}")
        time.sleep(0.05)
    with open(path) as pid:
        return int(pid.read().strip())


def _kill_executor() -> None:
    pid = os.getpid()
    while pid > 1:  # up from the Python worker to the JVM that forked its daemon
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"CoarseGrainedExecutorBackend" in cmdline.read():
                os.kill(pid, signal.SIGKILL)
                return
        with open(f"/proc/{pid}/status") as status:
            pid = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
    raise FailpointError("failpoint kill_executor: this Spark task does not run in an executor JVM of its own")


def _pause(name: str, timeout_s: float = 600.0) -> None:
    held, release = (os.path.join(failpoint_dir(), f"{what}-{name}") for what in ("held", "release"))
    open(held, "w").close()
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)


def _take(key: str, count: int) -> bool:
    """True for the first ``count`` passes of ``key`` on this machine (one marker file per pass)."""
    for n in range(count):
        marker = os.path.join(failpoint_dir(), f"fired-{key.replace('/', '_').replace(':', '_')}-{n}")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            continue
    return False
