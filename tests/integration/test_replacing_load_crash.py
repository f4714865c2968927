"""The replacing bulk load (``LOAD DATA .. REPLACE`` straight into the table) under SIGKILL at each of its steps.

An events table written whole under its only unique key takes the replacing path (``core.sink_kinds
.why_replace_is_not_upsert``). The operator's process is SIGKILLed at each step in turn, each crash met by the
next attempt: while the load runs (``during_write``: the rows are in the task's open XA branch or fenced
transaction), right after a task prepared its branch (``after_task_prepare``, XA), and at the protocol's steps
after the write. Then the same run again, more events and a later run: the table must hold every produced event
once, exactly as produced, with no prepared branch left and the committed batches tiling the topic.
"""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

import pytest

from airflow_eo.mysql.sink import MySqlUpsertAdapter, MySqlXaAdapter
from examples.page_views import produce_page_views
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.operator_harness import events_table, rows, run_job
from tests.support.page_views import (
    assert_contiguous,
    batch_rows,
    committed_offsets,
    our_prepared_branches,
    run_child,
)

POINTS = {
    "xa": ["during_write", "after_task_prepare=kill(driver)", "after_prepare", "in_store_commit",
           "after_commit_point", "between_xa_commits"],
    # While the load runs in its fenced transaction (held while the tasks vote); the upsert's steps after the write
    # are the protocol's, whatever the write path (test_crash.py runs them on page_view_events, which replaces too).
    "upsert": ["during_write"],
}
KINDS = {"xa": "MySqlXaSink", "upsert": "MySqlUpsertSink"}


@pytest.mark.parametrize("kind", ["xa", "upsert"])
def test_the_replacing_load_survives_sigkill_at_each_step(kind, bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 2)
    table, pipeline = events_table(mysql_kwargs), f"replace_{kind}_{topic_name}"
    job: dict[str, Any] = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
                           "options": {"write_partitions": 2},
                           "sink": {"kind": KINDS[kind], "table": table, "key_columns": ["event_id"]}}

    def child(run_id: str, fault: str | None = None) -> Any:
        return run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})],
                         fault=fault)

    sink = (MySqlXaAdapter if kind == "xa" else MySqlUpsertAdapter)(
        mysql_kwargs, name=kind, table=table, key_columns=("event_id",), updates={}, rows_per_statement=100,
        dead_letter_table="eo_dead_letter", bulk_load=True)
    sink.check()
    assert sink.replaces_rows(("event_id", "app_id", "user_id", "ts")), "the table takes the replacing path"
    events = produce_page_views(bootstrap, 1200, topic=topic_name)
    run_id = f"manual__{uuid.uuid4().hex}"
    for point in POINTS[kind]:
        batches = batch_rows(mysql_kwargs, pipeline)
        if batches and batches[-1]["state"] == "committed":
            run_id = f"manual__{uuid.uuid4().hex}"  # that run committed: the next crash kills a new one
        crashed = child(run_id, point)
        assert crashed.returncode == -signal.SIGKILL, (
            f"the run was not killed at {point}: rc={crashed.returncode}\n{why(crashed)}")
        if kind == "xa" and point in ("during_write", "after_task_prepare=kill(driver)", "after_prepare"):
            assert batch_rows(mysql_kwargs, pipeline)[-1]["state"] != "committed"
            assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}")[0][0] == committed_records(
                mysql_kwargs, pipeline), "nothing of the batch may be visible before the commit point"
        if point == "after_prepare":
            assert our_prepared_branches(mysql_kwargs, pipeline), "the crash should leave prepared branches"
        events += produce_page_views(bootstrap, 150, topic=topic_name)

    # The runs that must succeed run in this process (its Spark session is warm): the same run again resumes its
    # batch or returns the committed summary; then a later run.
    run_job({**job, "run_id": run_id})
    events += produce_page_views(bootstrap, 200, topic=topic_name)
    run_job({**job, "run_id": f"manual__{uuid.uuid4().hex}"})

    written = {r[0]: (r[1], r[2], r[3].isoformat(timespec="milliseconds"))
               for r in rows(mysql_kwargs, f"SELECT event_id, app_id, user_id, ts FROM {table}")}
    assert len(written) == len(events)
    assert written == {e["event_id"]: (e["app_id"], e["user_id"], e["ts"].removesuffix("Z")) for e in events}
    assert our_prepared_branches(mysql_kwargs, pipeline) == [], "prepared XA branches were left behind"
    assert sum(committed_offsets(mysql_kwargs, pipeline).values()) == len(events)
    assert_contiguous(batch_rows(mysql_kwargs, pipeline))


def committed_records(mysql_kwargs: dict[str, Any], pipeline: str) -> int:
    """The records of the committed batches (the rows the table may show: every event has its own id)."""
    return sum(r["until_offset"] - r["from_offset"] for b in batch_rows(mysql_kwargs, pipeline)
               if b["state"] == "committed" for r in b["ranges"])
