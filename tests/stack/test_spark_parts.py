"""``scripts/spark_parts.py``: the Spark cluster's JVMs as processes. A part ``up`` launched is alive until it exits,
whatever its command line reads meanwhile (empty while it execs: spark-class becomes java), and a part started once
more replaces the first launch instead of running beside it.

CI once took a master mid-exec for an exited one and started a second; Spark moved the second to the next free port,
worker1's, and ``up`` failed. These tests launch ``bash`` that execs ``sleep`` in place of a JVM."""

from __future__ import annotations

import importlib.util
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO

# bash's own command line does not name Spark; after the exec, the process's name does (as java's would).
EXECS_LATER = ["bash", "-c", "name=org.apache; sleep 0.5; exec -a $name.spark.deploy.Fake sleep 30"]


def load_spark_parts() -> ModuleType:
    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("eo_spark_parts", REPO / "scripts" / "spark_parts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def parts() -> Iterator[ModuleType]:
    module = load_spark_parts()
    yield module
    for name, proc in module.LAUNCHED.items():
        proc.kill()
        proc.wait()
        part = module.Part(name, ())
        part.pid_file.unlink(missing_ok=True)
        part.log.unlink(missing_ok=True)


def new_part(parts: ModuleType):
    return parts.Part(f"test-{uuid.uuid4().hex[:8]}", ())


def test_a_launched_part_is_running_from_its_launch_through_its_exec(parts):
    part = new_part(parts)
    parts.launch(EXECS_LATER, part, {"PATH": "/usr/bin:/bin"})
    pid = parts.LAUNCHED[part.name].pid
    seen = set()
    deadline = time.monotonic() + 1.5  # spans the exec at 0.5 s
    while time.monotonic() < deadline:
        seen.add(parts.spark_pid(part))
    assert seen == {pid}
    assert b"org.apache.spark.deploy.Fake" in Path(f"/proc/{pid}/cmdline").read_bytes()  # it did exec
    parts.LAUNCHED[part.name].kill()
    parts.LAUNCHED[part.name].wait()
    assert parts.spark_pid(part) is None


def test_a_part_started_again_replaces_the_first_launch(parts):
    part = new_part(parts)
    launched = []

    def start():
        parts.launch(EXECS_LATER, part, {"PATH": "/usr/bin:/bin"})
        launched.append(parts.LAUNCHED[part.name])

    start()
    with pytest.raises(SystemExit):  # never ready: started once more, then ``up`` ends with the part's log
        parts.ready_or_start_again(part, start, lambda: False, timeout=1)
    first, second = launched
    assert first.poll() is not None, "the first launch still runs beside the second"
    assert second.poll() is None
