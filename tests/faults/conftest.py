"""Infrastructure faults: the stack's own MariaDB and Kafka killed (SIGKILL) at a protocol step and restarted.

The batch runs in this process (the operator's real adapters and a Spark session shared by the tests);
the step's failpoint, armed with ``1*kill(server)``, SIGKILLs the server's process (registered by the test)
from wherever the step runs: the driver, or a Python worker of a Spark task.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.faults import Faults
from tests.support.stack import load_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def stack() -> ModuleType:
    module = load_stack()
    for service, pid_file in module.PID_FILES.items():
        if not module.pid_alive(pid_file):
            pytest.skip(f"infrastructure faults need the stack's own {service} (make up), not one of yours")
    return module


def _second_server(stack: ModuleType, server: str, pid_file: Path) -> Iterator[dict[str, Any]]:
    """``stack.second_<server>_up()``'s settings; stopped afterwards only when this started it."""
    started = not stack.pid_alive(pid_file)
    settings = getattr(stack, f"second_{server}_up")()
    yield settings
    if started:
        getattr(stack, f"second_{server}_down")()


@pytest.fixture(scope="session")
def second_mariadb(stack: ModuleType) -> Iterator[dict[str, Any]]:
    """A second MariaDB server for the offset store, so that store and sink live on two servers."""
    yield from _second_server(stack, "mariadb", stack.SECOND_MARIADB / "mariadb.pid")


@pytest.fixture(scope="session")
def second_postgres(stack: ModuleType) -> Iterator[dict[str, Any]]:
    """A second PostgreSQL server for the offset store, so that store and sink live on two servers."""
    yield from _second_server(stack, "postgres", stack.SECOND_POSTGRES / "postgres.pid")


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Faults:
    return Faults(monkeypatch, tmp_path)


@pytest.fixture(autouse=True)
def servers_back_up(stack: ModuleType) -> Iterator[None]:
    """Whatever a test killed runs again afterwards (the next test, and the rest of the suite, need it)."""
    yield
    for service, pid_file in stack.PID_FILES.items():
        if not stack.pid_alive(pid_file):
            stack.start(service)
