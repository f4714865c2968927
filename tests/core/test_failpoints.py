"""The one failpoint primitive: a no-op unless the switch arms it; counts, actions and the kill targets."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from airflow_eo.core import failpoints
from airflow_eo.core.failpoints import (
    FAILPOINT_DIR_ENV,
    FAILPOINTS_ENV,
    POINTS,
    FailpointError,
    arm,
    executor_env,
    failpoint,
    fired,
    parse,
    register_process,
    running,
)


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def arm_with(*entries: str) -> Path:
        for name, value in arm(*entries, directory=str(tmp_path)).items():
            monkeypatch.setenv(name, value)
        return tmp_path
    monkeypatch.delenv(FAILPOINTS_ENV, raising=False)
    return arm_with


def test_without_the_switch_every_point_is_a_no_op(monkeypatch):
    monkeypatch.delenv(FAILPOINTS_ENV, raising=False)
    for name in POINTS:
        failpoint(name)  # would raise, pause or kill this test if armed
    assert executor_env() == {}


def test_a_point_not_named_by_the_switch_does_nothing(armed):
    armed("after_plan=panic")
    failpoint("after_prepare")
    with pytest.raises(FailpointError, match="after_plan"):
        failpoint("after_plan")


def test_a_count_fires_the_first_n_passes_only_and_per_scope(armed):
    directory = armed("after_task_prepare=2*panic")
    for _ in range(2):
        with pytest.raises(FailpointError):
            failpoint("after_task_prepare")
    failpoint("after_task_prepare")  # the third pass: spent
    with pytest.raises(FailpointError):
        failpoint("after_task_prepare", scope="b7-3")  # another scope counts on its own
    assert sorted(p.name for p in directory.glob("fired-*")) == [
        "fired-after_task_prepare-0", "fired-after_task_prepare-1", "fired-after_task_prepare-b7-3-0"]


def test_pause_blocks_until_released(armed):
    directory = armed("task_write=1*pause")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (failpoint("task_write"), done.set()))
    worker.start()
    deadline = time.monotonic() + 10
    while not (directory / "held-task_write").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (directory / "held-task_write").exists()
    time.sleep(0.3)
    assert not done.is_set(), "the paused caller went on before the release"
    (directory / "release-task_write").touch()
    worker.join(10)
    assert done.is_set()
    failpoint("task_write")  # 1*: the second caller passes straight through


@pytest.mark.parametrize("switch, error", [
    ("no_such_point=kill", "unknown failpoint 'no_such_point'"),
    ("after_plan=explode", "is not name=\\[N\\*\\]action"),
    ("after_plan=kill(../etc)", "is not name=\\[N\\*\\]action"),
    ("after_plan=x*kill", "is not name=\\[N\\*\\]action"),
])
def test_a_bad_switch_says_what_is_wrong(switch, error):
    with pytest.raises(ValueError, match=error):
        parse(switch)


def test_arm_gives_each_named_point_its_crash_action(tmp_path):
    env = arm("during_write", "after_plan", "task_write=1*pause", directory=str(tmp_path))
    assert env == {FAILPOINTS_ENV: "during_write=kill(driver);after_plan=kill;task_write=1*pause",
                   FAILPOINT_DIR_ENV: str(tmp_path)}
    assert parse(env[FAILPOINTS_ENV])["during_write"] == (None, [("kill", "driver")])
    assert parse("mid_produce=sleep(5)->kill")["mid_produce"] == (None, [("sleep", "5"), ("kill", None)])


CHILD = """
import sys
from airflow_eo.core.failpoints import failpoint
print("before", flush=True)
failpoint(sys.argv[1])
print("after", flush=True)
"""


def run_child(tmp_path: Path, point: str, entry: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **arm(entry, directory=str(tmp_path))}
    return subprocess.run([sys.executable, "-c", CHILD, point], env=env, capture_output=True,
                          text=True, timeout=60)


def test_kill_sigkills_the_process_at_the_point(tmp_path):
    done = run_child(tmp_path, "after_plan", "after_plan=kill")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "before\n"


def test_kill_of_a_role_kills_only_the_registered_process_and_waits_until_it_is_gone(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        register_process(str(tmp_path), "server", victim.pid)
        done = run_child(tmp_path, "in_store_commit", "in_store_commit=1*kill(server)")
        assert (done.returncode, done.stdout) == (0, "before\nafter\n"), done.stderr  # the caller goes on
        assert victim.wait(10) == -signal.SIGKILL
        assert not running(victim.pid)
        again = run_child(tmp_path, "in_store_commit", "in_store_commit=1*kill(server)")
        assert again.returncode == 0  # spent: fired once
        # The trace a fault test shows when a kill did not land where it expected: fired once, by the child.
        trace = fired(str(tmp_path))
        assert [line.split(" ", 1)[1].rsplit(", run by", 1)[0] for line in trace] == [
            f"in_store_commit: kill(server) pid {victim.pid}", f"in_store_commit: kill(server) pid {victim.pid}: gone"]
    finally:
        victim.kill()


# A postmaster: a child in a session of its own (out of its parent's process group) that outlives its parent.
SERVER = """
import os, subprocess, sys, time
backend = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(backend.pid, flush=True)
time.sleep(600)
"""


def test_kill_of_a_server_kills_its_process_tree_even_children_in_sessions_of_their_own(tmp_path):
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    backend = int(server.stdout.readline())
    try:
        register_process(str(tmp_path), "server", server.pid)
        done = run_child(tmp_path, "in_store_commit", "in_store_commit=1*kill(server)")
        assert (done.returncode, done.stdout) == (0, "before\nafter\n"), done.stderr
        assert server.wait(10) == -signal.SIGKILL
        # Gone when the kill returned, not only later: a backend still up could commit what the caller sends next.
        assert not running(backend)
    finally:
        server.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(backend, signal.SIGKILL)


def test_kill_of_a_role_nobody_registered_fails_instead_of_killing_anything(tmp_path, monkeypatch):
    monkeypatch.setenv(FAILPOINT_DIR_ENV, str(tmp_path))
    with pytest.raises(FailpointError, match="no process registered as driver"):
        failpoints._registered("driver", timeout_s=0.2)


def test_the_switch_reaches_executors_as_spark_conf(armed):
    directory = armed("during_write")
    assert executor_env() == {f"spark.executorEnv.{FAILPOINTS_ENV}": "during_write=kill(driver)",
                              f"spark.executorEnv.{FAILPOINT_DIR_ENV}": str(directory)}


def test_the_points_are_the_ones_the_code_passes():
    """Every name in POINTS is passed by the code, and the code passes no other name."""
    package = Path(failpoints.__file__).resolve().parents[1]
    used = set()
    for path in package.rglob("*.py"):
        used.update(re.findall(r'\bfailpoint\("([a-z_]+)"', path.read_text()))
    assert used == set(POINTS)
