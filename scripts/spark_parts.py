"""The JVMs of the local Spark cluster (``scripts/spark_cluster.py``) as processes: launched each in a session of its
own with its pid in a file and its log, waited for, started once more when one dies before it is ready, stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stack import STACK, pid_alive

SPARK = STACK / "spark"


def die(message: str) -> NoReturn:
    print(f"spark_cluster: {message}", file=sys.stderr)
    sys.exit(1)


def say(message: str) -> None:
    print(f"spark_cluster: {message}", flush=True)


@dataclass(frozen=True)
class Part:
    """One JVM of the cluster: its pid file, log, working directory and the ports it must open."""

    name: str
    ports: tuple[int, ...]

    @property
    def pid_file(self) -> Path:
        return SPARK / f"{self.name}.pid"

    @property
    def log(self) -> Path:
        return SPARK / "logs" / f"{self.name}.log"

    @property
    def run_dir(self) -> Path:
        return SPARK / "run" / self.name


def launch(cmd: list[str], part: Part, env: dict[str, str]) -> None:
    """Like stack.spawn, with the part's own working directory (Spark writes files there)."""
    part.run_dir.mkdir(parents=True, exist_ok=True)
    part.log.parent.mkdir(parents=True, exist_ok=True)
    with open(part.log, "ab") as out:
        # A marker, so that a failure shows what this launch printed and not what an earlier JVM did.
        out.write(f"--- spark_cluster: launching {part.name} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=part.run_dir)
    part.pid_file.write_text(str(proc.pid))
    LAUNCHED[part.name] = proc


#: The processes this run started, by part: their exit code tells why one died before it was ready.
LAUNCHED: dict[str, subprocess.Popen] = {}


def spark_pid(part: Part) -> int | None:
    """The pid of the part's JVM if it runs (a pid file whose process is not Spark's is stale).

    A process this run launched is alive until it exits, whatever its command line says: while a process execs
    (spark-class becoming java) /proc/<pid>/cmdline reads empty. Taken for an exit once on CI, that made ``up``
    start a second master, which took worker1's port (Spark moves to the next port when one is taken)."""
    pid = pid_alive(part.pid_file)
    if pid is None:
        return None
    proc = LAUNCHED.get(part.name)
    if proc is not None and proc.pid == pid:
        return pid if proc.poll() is None else None
    for _ in range(10):  # empty while it execs or exits: look again
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if cmdline:
            return pid if b"org.apache.spark" in cmdline else None
        time.sleep(0.05)
    return None


def process_state(pid: int) -> str:
    """What the kernel says a process is doing (state and wait channel): tells a hung JVM from a busy one."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
        threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
    except OSError:
        return f"pid {pid} gone"
    return f"pid {pid} state {state}, waiting in {wchan}, {threads} threads"


def last_launch_log(part: Part) -> str:
    """The part's log since its last launch marker (at most the last 4000 characters)."""
    text = part.log.read_text(errors="replace") if part.log.exists() else "(no log)"
    marker = text.rfind("--- spark_cluster: launching")
    return text[max(marker, 0):][-4000:]


def why_not_ready(part: Part, timeout: float) -> str:
    pid = spark_pid(part)
    if pid:
        return f"did not become ready in {timeout:.0f}s ({process_state(pid)})"
    proc = LAUNCHED.get(part.name)
    code = proc.poll() if proc else None
    return "exited" + (f" with code {code}" if code is not None else "")


def wait_until(part: Part, check, timeout: float, fatal: bool = True) -> bool:
    """Wait for ``check``; a part that exits or stays unready dies with its log, unless not ``fatal``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        if not spark_pid(part):
            break
        time.sleep(0.3)
    if not fatal:
        return False
    die(f"{part.name} {why_not_ready(part, timeout)}; its log since it was launched ({part.log}):\n"
        f"{last_launch_log(part)}")


def ready_or_start_again(part: Part, start, check, timeout: float) -> None:
    """Wait until ``check``; a part that exits or stays unready is stopped and started once more.

    Seen on CI: a JVM started right after another stopped exited at once, or a Connect server relaunched after
    a SIGKILL printed nothing for minutes. The parts hold no state a restart loses (workers re-register,
    Connect sessions reconnect); a second failure ends ``up`` with the part's log.
    """
    if wait_until(part, check, timeout, fatal=False):
        return
    say(f"{part.name} {why_not_ready(part, timeout)}; its log since launch:\n{last_launch_log(part)}\n"
        f"starting {part.name} again")
    proc = LAUNCHED.get(part.name)
    pids = {pid for pid in (spark_pid(part), proc.pid if proc and proc.poll() is None else None) if pid}
    if pids:
        terminate(list(pids), group=True)
    part.pid_file.unlink(missing_ok=True)
    start()
    wait_until(part, check, timeout)


def exited(pid: int) -> bool:
    """Gone, or a child of ours that exited (reaped here: a zombie's /proc entry stays until its parent waits)."""
    launched = next((proc for proc in LAUNCHED.values() if proc.pid == pid), None)
    if launched is not None:
        return launched.poll() is not None
    return not Path(f"/proc/{pid}").exists()


def terminate(pids: list[int], group: bool) -> list[int]:
    """SIGTERM (the process groups of) ``pids``, SIGKILL what still runs after 20s; return what survived."""
    kill = os.killpg if group else os.kill
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        for pid in pids:
            try:
                kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if not exited(pid)]
            time.sleep(0.2)
        if not pids:
            break
    return pids


def leftovers() -> list[int]:
    """Executors and Python workers still running in our directories (e.g. after a worker was SIGKILLed)."""
    root = str(SPARK.resolve()) + os.sep
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd") + os.sep
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(root) and ("org.apache.spark" in cmdline or "pyspark" in cmdline):
            found.append(int(entry.name))
    return found
