"""Starting, waiting for and stopping the stack's processes (each in a session of its own, its pid in a file)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from airflow_eo.core.failpoints import running


def die(message: str) -> NoReturn:
    print(f"stack: {message}", file=sys.stderr)
    sys.exit(1)


def require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if not path:
        die(f"'{tool}' not found: {hint}")
    return path


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def pid_alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if running(pid) else None


def wait_for(what: str, check, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    die(f"{what} did not become ready in {timeout:.0f}s; last log lines:\n{tail}")


def spawn(cmd: list[str], log: Path, pid_file: Path, env: dict | None = None, **as_user: Any) -> None:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, **as_user,
        )
    pid_file.write_text(str(proc.pid))



def stop(name: str, pid_file: Path, how: signal.Signals = signal.SIGTERM) -> None:
    stop_together({name: pid_file}, how)


def stop_together(services: dict[str, Path], how: signal.Signals = signal.SIGTERM) -> None:
    """Signal every service at once, give them 30 s together, then SIGKILL what is left. The nodes of a KRaft
    cluster must go together: stopped one after another, the last voter waits for a quorum that is gone and takes
    the whole 30 s (seen: a 35 s teardown of the three-node cluster)."""
    running = {name: (pid_file, pid) for name, pid_file in services.items() if (pid := pid_alive(pid_file))}
    for _, pid in running.values():
        os.killpg(pid, how)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(pid_alive(pid_file) for pid_file, _ in running.values()):
        time.sleep(0.3)
    for name, (pid_file, pid) in running.items():
        if pid_alive(pid_file):
            os.killpg(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
        print(f"stack: {name} stopped")

