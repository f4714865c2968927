"""Infrastructure faults: the stack's own MariaDB and Kafka killed (SIGKILL) at a protocol step and restarted.

The batch runs in this process (the operator's real adapters and a Spark session shared by the tests);
the step's fault hook (``AIRFLOW_EO_FAULT`` + ``AIRFLOW_EO_FAULT_KILL``) SIGKILLs the server's process
from wherever the step runs: the driver, or a Python worker of a Spark task.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_eo.core.faults import FAULT_DIR_ENV, FAULT_ENV, FAULT_KILL_ENV, running
from airflow_eo.hooks.spark import SparkSessionHook

REPO = Path(__file__).resolve().parents[2]


def load_stack() -> ModuleType:
    """``scripts/stack.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("eo_stack", REPO / "scripts" / "stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def stack() -> ModuleType:
    module = load_stack()
    for service, pid_file in module.PID_FILES.items():
        if not module.pid_alive(pid_file):
            pytest.skip(f"infrastructure faults need the stack's own {service} (make up), not one of yours")
    return module


@pytest.fixture(scope="session")
def second_mariadb(stack: ModuleType) -> Iterator[dict[str, Any]]:
    """A second MariaDB server for the offset store, so that store and sink live on two servers."""
    started = not stack.pid_alive(stack.SECOND_MARIADB / "mariadb.pid")
    settings = stack.second_mariadb_up()
    yield settings
    if started:
        stack.second_mariadb_down()


class Faults:
    """Arms one step's fault: the driver sees it in its environment, Spark's Python workers through
    the context's executor environment (read whenever a task's Python function is shipped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.monkeypatch, self.tmp_path = monkeypatch, tmp_path
        self.spark = SparkSessionHook().get_conn()

    @contextmanager
    def kill_at(self, point: str, pid_file: Path) -> Iterator[None]:
        fault_dir = self.tmp_path / f"fault-{point}-{time.monotonic_ns()}"
        fault_dir.mkdir()
        env = {FAULT_ENV: point, FAULT_KILL_ENV: str(pid_file), FAULT_DIR_ENV: str(fault_dir)}
        executor_env = self.spark.sparkContext.environment
        for name, value in env.items():
            self.monkeypatch.setenv(name, value)
            executor_env[name] = value
        try:
            yield
        finally:
            for name in env:
                self.monkeypatch.delenv(name)
                executor_env.pop(name, None)


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Faults:
    return Faults(monkeypatch, tmp_path)


def gone(pid: int, timeout_s: float = 30.0) -> bool:
    """True once ``pid`` has exited (SIGKILL is delivered at once, but a big process takes a moment to go)."""
    deadline = time.monotonic() + timeout_s
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(autouse=True)
def servers_back_up(stack: ModuleType) -> Iterator[None]:
    """Whatever a test killed runs again afterwards (the next test, and the rest of the suite, need it)."""
    yield
    for service, pid_file in stack.PID_FILES.items():
        if not stack.pid_alive(pid_file):
            stack.start(service)
