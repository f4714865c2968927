"""Helpers for tests of the page-views example DAGs: reset, run a DAG in a child process, ground truth."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pymysql

from airflow_eo.core.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV, arm, register_process
from examples import page_views
from examples.state import our_prepared_branches, reset_page_views, sink_state
from tests.support import fork_server
from tests.support.children import communicate_within
from tests.support.operator_harness import rows

REPO = Path(__file__).resolve().parents[2]
XA_PIPELINE, UPSERT_PIPELINE = "page_views_xa", "page_view_events_upsert"


@dataclass
class Truth:
    pv_per_app: dict[str, int]
    event_ids: set[str]
    end_offsets: dict[int, int]


def topic_truth(bootstrap: str, topic: str = page_views.TOPIC) -> Truth:
    """Everything committed in the topic, read with a plain read_committed consumer (not Spark, not us)."""
    return Truth(*page_views.ground_truth(bootstrap, topic))


def reset(mysql_kwargs: dict[str, Any], *pipelines: str) -> None:
    reset_page_views(mysql_kwargs, *pipelines)


def run_dag(dag_id: str, logical_date: datetime | Sequence[datetime] | None = None, fault: str | None = None,
            env: dict[str, str] | None = None, timeout: float = 600,
            conf: dict[str, Any] | None = None) -> subprocess.CompletedProcess:
    """Run the DAG with ``dag.test()`` in a child process (so that it can be SIGKILLed for real); several logical
    dates: their runs one after the other in that one process (a child's Python and Spark start cost ~15 s).

    ``fault``: a failpoint armed in the child, by name (its crash action: ``airflow_eo.core.failpoints.POINTS``)
    or as ``name=actions``; the child is registered as the ``driver`` its ``kill(driver)`` may kill.
    """
    dates = [logical_date] if isinstance(logical_date, datetime) else list(logical_date or [])
    dates = dates or [datetime.now(timezone.utc)]
    args = [str(REPO / "scripts" / "run_dag.py"), dag_id, ",".join(d.isoformat() for d in dates)]
    if conf is not None:
        args.append(json.dumps(conf))
    return run_child(args, fault, env, timeout)


def run_child(args: list[str], fault: str | None = None, env: dict[str, str] | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """``python *args`` in a child process with ``fault`` armed (see :func:`run_dag`), registered as the
    ``driver``."""
    child_env = {k: v for k, v in os.environ.items() if k not in (FAILPOINTS_ENV, FAILPOINT_DIR_ENV)}
    child_env.update(env or {})
    made = None  # a failpoint folder of our own, removed after the child (a caller's folder is the caller's)
    if fault:
        if not child_env.get(FAILPOINT_DIR_ENV):
            made = tempfile.mkdtemp(prefix="eo-fp-")
        child_env.update(arm(fault, directory=child_env.get(FAILPOINT_DIR_ENV) or made))
    try:
        with fork_server.start(args, child_env) as child:
            if fault:
                register_process(child_env[FAILPOINT_DIR_ENV], "driver", child.pid)
            stdout, stderr = communicate_within(child, timeout, python_stacks=True)
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def start_held(job: dict[str, Any], run_id: str, point: str, folder: Path, wait: bool = True) -> fork_server.Child:
    """An operator run (``tests.support.operator_child``) held at ``point`` (``pause``, its first pass only)
    until :func:`release`; with ``wait``, returns once it is held there (:func:`wait_held`)."""
    env = {**os.environ, **arm(f"{point}=1*pause", directory=str(folder))}
    held = fork_server.start(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})], env)
    if wait:
        wait_held(held, point, folder)
    return held


def wait_held(held: fork_server.Child, point: str, folder: Path) -> None:
    deadline = time.monotonic() + 300
    while not (folder / f"held-{point}").exists():
        if held.poll() is not None or time.monotonic() > deadline:
            held.kill()
            out, err = held.communicate()
            raise AssertionError(f"the run ended or hung before {point}: {(out + err)[-4000:]}")
        time.sleep(0.2)


def release(held: fork_server.Child, point: str, folder: Path) -> subprocess.CompletedProcess:
    """Let a held run go on (:func:`start_held`) and wait for its end."""
    (folder / f"release-{point}").touch()
    try:
        out, err = held.communicate(timeout=300)
    finally:
        if held.poll() is None:
            held.kill()
    return subprocess.CompletedProcess(held.args, held.returncode, out, err)


def committed_offsets(mysql_kwargs: dict[str, Any], pipeline: str) -> dict[int, int]:
    conn = pymysql.connect(**mysql_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s", (pipeline,))
            return {int(p): int(o) for p, o in cur.fetchall()}
    finally:
        conn.close()


def batch_rows(mysql_kwargs: dict[str, Any], pipeline: str) -> list[dict[str, Any]]:
    conn = pymysql.connect(**mysql_kwargs, autocommit=True, cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT batch_id, run_id, state, ranges FROM eo_batch WHERE pipeline_id = %s "
                        "ORDER BY batch_id", (pipeline,))
            return [{**r, "ranges": json.loads(r["ranges"])} for r in cur.fetchall()]
    finally:
        conn.close()


def assert_contiguous(batches: list[dict[str, Any]]) -> None:
    """Committed batches tile each partition's offsets with no gap and no overlap."""
    position: dict[tuple[str, int], int] = {}
    for batch in batches:
        if batch["state"] != "committed":
            continue
        for r in batch["ranges"]:
            key = (r["topic"], r["partition"])
            if key in position:
                assert r["from_offset"] == position[key], f"gap/overlap at {key} in batch {batch['batch_id']}"
            position[key] = r["until_offset"]


def assert_exactly_once(mysql_kwargs: dict[str, Any], bootstrap: str, pipeline: str) -> Truth:
    truth = topic_truth(bootstrap)
    pv, ids = sink_state(mysql_kwargs)
    if pipeline == XA_PIPELINE:
        assert pv == truth.pv_per_app, "app_pv differs from the page views in the topic"
    else:
        assert len(ids) == len(set(ids)) and set(ids) == truth.event_ids, "page_view_events differs from the topic"
    assert our_prepared_branches(mysql_kwargs, pipeline) == [], "prepared XA branches were left behind"
    assert committed_offsets(mysql_kwargs, pipeline) == truth.end_offsets, "offsets are not at the end of the topic"
    assert_contiguous(batch_rows(mysql_kwargs, pipeline))
    return truth


# --------------------------------------------------------------------------- interval mode

HOUR = timedelta(hours=1)
# Recent past hours: Kafka's retention (7 days) deletes segments by their records' timestamps.
T0 = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - 8 * HOUR


def hour(h: int) -> tuple[datetime, datetime]:
    return T0 + h * HOUR, T0 + (h + 1) * HOUR


def produce_hours(bootstrap: str, topic: str, counts: list[int]) -> list[dict[str, Any]]:
    """``counts[h]`` events spread over hour h, in time order."""
    stamps = [hour(h)[0] + (k + 1) * HOUR / (n + 1) for h, n in enumerate(counts) for k in range(n)]
    return page_views.produce_page_views(bootstrap, 0, topic, timestamps=stamps)


def hours_truth(events: list[dict[str, Any]], *hours: int) -> set[str]:
    def in_hours(ts: str) -> bool:
        moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        return any(hour(h)[0] <= moment < hour(h)[1] for h in hours)

    return {e["event_id"] for e in events if in_hours(e["ts"])}


def table_rows(mysql_kwargs: dict[str, Any], table: str) -> list[tuple]:
    return rows(mysql_kwargs, f"SELECT event_id, app_id, user_id, ts FROM {table} ORDER BY event_id")
