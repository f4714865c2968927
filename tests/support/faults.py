"""Infrastructure faults: a step's failpoint armed to SIGKILL a server (:class:`Faults`), a supervisor that starts a
killed service again, and the checks of a pipeline's end state after the faults."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_eo.core.failpoints import arm, register_process, running
from airflow_eo.hooks.spark import SparkSessionHook
from examples import ip_counts, page_views
from examples.state import our_prepared_branches
from examples.topics import read_topic
from tests.support.kafka_group import group_positions
from tests.support.operator_harness import rows
from tests.support.page_views import assert_contiguous


def store_rows(store_kwargs: dict[str, Any], sql: str, args: tuple = ()) -> list[tuple]:
    return rows(store_kwargs, sql, args)


def check_end_state(kind: str, table: str, pipeline: str, bootstrap: str, topic: str,
                    sink_kwargs: dict[str, Any], store_kwargs: dict[str, Any]) -> None:
    pv_per_app, event_ids, end_offsets = page_views.ground_truth(bootstrap, topic)
    if kind == "xa":
        assert dict(rows(sink_kwargs, f"SELECT app_id, pv FROM {table}")) == pv_per_app, "counts differ from the topic"
    else:
        assert {r[0] for r in rows(sink_kwargs, f"SELECT event_id FROM {table}")} == event_ids
    assert our_prepared_branches(sink_kwargs, pipeline) == [], "prepared XA branches were left behind"
    offsets = dict(store_rows(store_kwargs, "SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                              (pipeline,)))
    assert offsets == end_offsets, "committed offsets are not at the end of the topic"
    batches = [{"batch_id": b, "state": s, "ranges": json.loads(r)} for b, s, r in store_rows(
        store_kwargs, "SELECT batch_id, state, ranges FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
        (pipeline,))]
    assert_contiguous(batches)


def check_kafka_sink_end_state(bootstrap: str, source: str, out: str, op: Any, mysql_kwargs: dict[str, Any]) -> None:
    """The ip-counts pipeline's output as a read_committed consumer sees it equals the counts of its input,
    no batch's record is there twice, and the store, the Kafka group and the input's end agree."""
    truth = Counter(ip_counts.window_key(v.decode()) for _, v in read_topic(bootstrap, source)[0])
    committed = [(k.decode(), json.loads(v)) for k, v in read_topic(bootstrap, out, "read_committed")[0]]
    sums: Counter[str] = Counter()
    for key, value in committed:
        sums[key] += value["count"]
    assert sums == truth, "the committed output differs from the counts of the input"
    per_batch = Counter((key, value["batch_id"]) for key, value in committed)
    assert max(per_batch.values()) == 1, "a read_committed consumer saw a batch's record twice"
    store = {(t, p): o for t, p, o in store_rows(
        mysql_kwargs, "SELECT topic, kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
        (op.pipeline_id,))}
    assert store == group_positions(bootstrap, op.pipeline_id, source), "store and the Kafka group disagree"
    assert store == {(source, p): o for p, o in read_topic(bootstrap, source)[1].items()}


class Faults:
    """Arms one step's failpoint: the driver sees it in its environment, Spark's Python workers through
    the context's executor environment (read whenever a task's Python function is shipped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.monkeypatch, self.tmp_path = monkeypatch, tmp_path
        self.spark = SparkSessionHook().get_conn()

    @contextmanager
    def kill_at(self, point: str, pid_file: Path) -> Iterator[Path]:
        """Arms ``point`` to SIGKILL the process of ``pid_file`` once; yields the fault's directory (its
        ``fired.log``, read by :func:`airflow_eo.core.failpoints.fired`, says when and from which process it fired)."""
        fault_dir = self.tmp_path / f"fault-{point}-{time.monotonic_ns()}"
        fault_dir.mkdir()
        register_process(str(fault_dir), "server", int(pid_file.read_text().strip()))
        env = arm(f"{point}=1*kill(server)", directory=str(fault_dir))
        executor_env = self.spark.sparkContext.environment
        for name, value in env.items():
            self.monkeypatch.setenv(name, value)
            executor_env[name] = value
        try:
            yield fault_dir
        finally:
            for name in env:
                self.monkeypatch.delenv(name)
                executor_env.pop(name, None)


def gone(pid: int, timeout_s: float = 30.0) -> bool:
    """True once ``pid`` has exited (SIGKILL is delivered at once, but a big process takes a moment to go)."""
    deadline = time.monotonic() + timeout_s
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Supervisor:
    """Starts a killed service again as soon as it is gone, as systemd or Kubernetes would, while the
    batch goes on: the attempt meets a broker that is down for the seconds its restart takes."""

    def __init__(self, stack: ModuleType, service: str) -> None:
        self.stack, self.service = stack, service
        self.restarts = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"supervise-{service}", daemon=True)

    def _watch(self) -> None:
        pid_file = self.stack.pid_file_of(self.service)
        while not self._stop.is_set():
            if not self.stack.pid_alive(pid_file):
                try:
                    self.stack.start(self.service)
                    self.restarts += 1
                except BaseException as exc:  # SystemExit from the stack's die(): reported by stop()
                    self.errors.append(exc)
                    return
            self._stop.wait(0.1)

    def wait_for_restart(self, timeout: float = 120) -> None:
        """Until the service was started again once (or the time is up): an attempt may end within the watcher's
        poll after the kill (seen in CI: a run that committed just before its coordinator died returned at once)."""
        deadline = time.monotonic() + timeout
        while self.restarts == 0 and not self.errors and time.monotonic() < deadline:
            time.sleep(0.1)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self.errors, f"restarting {self.service} failed: {self.errors!r}"
