"""The processes of a throwaway Airflow deployment (tests/scheduler/airflow_services.py): each service a subprocess
in its own process group, its output in a log file; stopped with its stray descendants."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil


class AirflowServicesError(RuntimeError):
    """A service failed to start, a request failed, or a wait timed out; the message carries log tails."""


@dataclass
class ServiceProcess:
    """One long-running ``airflow <command>`` subprocess in its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    descendants: list[psutil.Process] = field(default_factory=list)
    args: tuple[str, ...] = ()  # the ``airflow`` command's arguments: what starts it again

    @property
    def running(self) -> bool:
        return self.popen.poll() is None


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def spawn_service(name: str, command: Sequence[str], env: dict[str, str], cwd: Path, log_dir: Path) -> ServiceProcess:
    """Start ``command`` in a process group of its own, its output in ``<log_dir>/<name>.log``."""
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log_file:
        popen = subprocess.Popen(
            list(command),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ServiceProcess(name=name, popen=popen, log_path=log_path)


def stop_services(services: Sequence[ServiceProcess], timeout: float) -> None:
    """SIGTERM every service's process group (and stray descendants), SIGKILL what is left after ``timeout``."""
    for service in services:
        service.descendants = _descendants(service.popen.pid)
        signal_group(service.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for service in services:
        try:
            service.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for service in services:
        signal_group(service.popen.pid, signal.SIGKILL)
        alive = [p for p in service.descendants if p.is_running()]
        for proc in alive:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        try:
            service.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def raise_if_a_service_died(services: Sequence[ServiceProcess]) -> None:
    for service in services:
        if not service.running:
            raise AirflowServicesError(
                f"airflow {service.name} exited with {service.popen.returncode}\n"
                f"--- {service.log_path} ---\n{tail(service.log_path, 80)}"
            )


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group led by ``pid`` (the service was started with ``start_new_session``)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
