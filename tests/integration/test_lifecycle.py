"""Retire and rename on real stores (issue 44, item 3): MariaDB's for the retire, PostgreSQL's for the rename.

- Retire: an XA pipeline with ``dedup_key`` and dead letters commits a batch, then a run of it is held right after
  its branches were prepared: ``retire`` is refused (a run is going on). The run is SIGKILLed; ``airflow eo retire
  --apply`` then rolls its prepared branch back (under the pipeline's fence, audited as ``recover``), removes its seen
  ids, dead letters and consumer group, and keeps a tombstone: the next run of the id is refused with the message that
  says what to do, and runs after ``retire --undo``, continuing from the committed offsets (the sink then equals the
  ground truth).
- Rename: a two-phase pipeline commits a batch, a run of it is SIGKILLed after prepare; ``rename`` is refused (in
  doubt), ``recover`` resolves it, ``airflow eo rename --apply`` moves it; the next run under the new id continues
  exactly where the old one stopped: the sink equals the ground truth, no record lost or doubled. It is then moved to
  the MariaDB store (retired in PostgreSQL's, ``airflow eo seed`` with its committed offsets under a new id in
  MariaDB's), and its first batch there reads exactly the records after them.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pymysql
import pytest

from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.core.errors import OperationError, RetiredPipelineError
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.mysql.xa import xa_session
from airflow_eo.ops.lifecycle import PipelineLifecycle
from airflow_eo.postgres.prepared import prepared_session
from airflow_eo.sinks import MySqlXaSink, PostgresTwoPhaseSink
from airflow_eo.sqlsink.pipeline_owners import OWNER_TABLE
from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE
from examples.page_views import produce_page_views
from tests.support.children import why
from tests.support.cli import eo
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, rows, run
from tests.support.page_views import run_child, start_held
from tests.support.postgres import COUNTS_DDL, EVENTS_DDL, pg_rows

PG_STORE = "eo_lifecycle_pg_store"
COUNT = "airflow_eo.examples.page_views.count_per_app"


def pv_of(events: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(e["app_id"] for e in events))


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {table: n for table, n in counts.items() if n}


def ids_of(events: list[dict[str, Any]]) -> list[str]:
    return sorted(e["event_id"] for e in events)


def ids_in(mysql_kwargs: dict[str, Any], table: str) -> list[str]:
    return sorted(r[0] for r in rows(mysql_kwargs, f"SELECT event_id FROM {table}"))


def mysql_update_waits(mysql_kwargs: dict[str, Any], table: str, events: list[dict[str, Any]]) -> bool:
    """Whether another session's write of the events' rows waits on a lock (1 s) rather than succeeding."""
    conn = pymysql.connect(**mysql_kwargs, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            try:
                cur.execute(f"DELETE FROM {table} WHERE event_id = %s", (events[0]["event_id"],))
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1205, exc
                return True
        conn.rollback()
        return False
    finally:
        conn.close()


@pytest.fixture
def cleanup(mysql_kwargs, postgres_kwargs):
    """No branch of the test's pipelines stays prepared on the shared servers, whatever the outcome."""
    made: dict[str, list[str]] = {"pipelines": [], "mysql": [], "postgres": []}
    yield made
    with xa_session(mysql_kwargs) as xa:
        for xid in (x for p in made["pipelines"] for x in xa.recover(p)):
            xa.rollback(xid)
    with prepared_session(postgres_kwargs) as prepared:
        for xid in (x for p in made["pipelines"] for x in prepared.recover(p)):
            prepared.rollback(xid)
    for table in made["mysql"]:
        rows(mysql_kwargs, f"DROP TABLE IF EXISTS {table}")
    for table in made["postgres"]:
        pg_rows(postgres_kwargs, f"DROP TABLE IF EXISTS {table}")


def test_retire_is_refused_while_a_run_is_held_then_resolves_its_killed_runs_branch_and_removes_its_rows(
        cleanup, bootstrap, mysql_kwargs, airflow_db, tmp_path: Path):
    started = time.monotonic()
    suffix = uuid.uuid4().hex[:8]
    topic = create_topic(bootstrap, f"retire_{suffix}", 3)
    pipeline, table = f"retire_{suffix}", f"retire_pv_{suffix}"
    cleanup["pipelines"].append(pipeline)
    cleanup["mysql"].append(table)
    rows(mysql_kwargs, EVENTS_DDL.format(name=table))
    sink = {"table": table, "key_columns": ["event_id"]}
    # No transform: the write tasks mark the copies themselves (no Spark job of its own).
    options: dict[str, Any] = {"dedup_key": ["event_id"], "on_bad_record": "dead_letter"}
    first = produce_page_views(bootstrap, 200, topic=topic, raw_values=[b"not json", b"{"])
    one = run(operator(topic, MySqlXaSink(**sink), pipeline, **options))
    assert (one["batch_id"], one["dead_letters"]) == (0, 2), one
    second = produce_page_views(bootstrap, 100, topic=topic)
    kafka = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    partitions = [(topic, p) for p in range(3)]
    assert len(kafka.group_offsets(pipeline, partitions)) == 3, "the run mirrors its offsets into its group"
    ops = pipeline_operations()
    lifecycle = PipelineLifecycle(ops)
    assert nonzero(lifecycle.retire(pipeline).plan.sink_rows) == {SEEN_ID_TABLE: 200, OWNER_TABLE: 1}
    first_done = time.monotonic()

    # A run held right after its branches were prepared: retire is refused, dry run and --apply alike.
    job = {"topic": topic, "pipeline_id": pipeline, "sink": {"kind": "MySqlXaSink", **sink}, "options": options}
    held = start_held(job, f"manual__{uuid.uuid4().hex}", "after_prepare", tmp_path)
    try:
        dry = lifecycle.retire(pipeline, dead_letters=True)
        assert dry.refusal is not None and "batch 1 is prepared" in dry.refusal and "run going on" in dry.refusal
        with pytest.raises(OperationError, match="may have a run going on: batch 1 is prepared"):
            lifecycle.retire(pipeline, apply=True, reason="DAG deleted", dead_letters=True)
    finally:
        held.send_signal(signal.SIGKILL)
        held.communicate()
    assert held.returncode == -signal.SIGKILL
    held_done = time.monotonic()
    assert mysql_update_waits(mysql_kwargs, table, second), "the killed run's prepared branch holds its rows"
    with xa_session(mysql_kwargs) as xa:
        assert xa.recover(pipeline), "the killed run left its branches prepared"

    # The run is gone (killed): quiet for 1 s is enough to say so. The CLI retires it.
    time.sleep(1.0)
    done = eo("retire", pipeline, "--dead-letters", "--idle-for", "1s", "--apply", "--reason", "DAG deleted",
              "-o", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["epoch"] is not None and report["group_deleted"] is True, report
    assert nonzero(report["removed"]) == {SEEN_ID_TABLE: 200, OWNER_TABLE: 1, "eo_dead_letter": 2}, report
    assert [b["action"] for b in report["recovery"]["branches"]] and \
        {b["action"] for b in report["recovery"]["branches"]} == {"rollback"}, report
    with xa_session(mysql_kwargs) as xa:
        assert not xa.recover(pipeline), "the branch is rolled back"
    assert not mysql_update_waits(mysql_kwargs, table, second)
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {SEEN_ID_TABLE} WHERE pipeline_key = %s",
                (seen_pipeline_key(pipeline),)) == [(0,)]
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM eo_dead_letter WHERE pipeline_id = %s", (pipeline,)) == [(0,)]
    assert kafka.group_offsets(pipeline, partitions) == {}, "the consumer group is deleted"
    assert ids_in(mysql_kwargs, table) == ids_of(first), "the rolled back batch wrote nothing"
    audit = [(a.action, a.reason, a.details.get("completed")) for a in ops.store.audit_log(pipeline, 10)]
    assert audit[:2] == [("retire", "DAG deleted", True), ("recover", "DAG deleted", True)], audit

    # Its id does not run again by accident; the message says what to do.
    with pytest.raises(RetiredPipelineError, match=f"airflow eo retire {pipeline} --undo --apply --reason TEXT"):
        run(operator(topic, MySqlXaSink(**sink), pipeline, **options))
    assert lifecycle.undo_retire(pipeline).dry_run
    assert lifecycle.undo_retire(pipeline, apply=True, reason="the topic is back").epoch is not None
    with pytest.raises(OperationError, match="is not retired"):
        lifecycle.undo_retire(pipeline, apply=True, reason="again")
    # Brought back, it continues from its committed offsets.
    three = run(operator(topic, MySqlXaSink(**sink), pipeline, **options))
    assert (three["batch_id"], three["records_in"], three["dead_letters"]) == (2, 100, 0), three
    assert ids_in(mysql_kwargs, table) == ids_of(first + second)
    print(f"first run {first_done - started:.1f}s, held and killed run {held_done - first_done:.1f}s, "
          f"retire and the runs after {time.monotonic() - held_done:.1f}s")


@pytest.fixture
def pg_store(monkeypatch) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    return PG_STORE


def test_rename_after_a_killed_run_is_refused_until_recovered_then_the_new_id_continues_exactly(
        cleanup, pg_store, bootstrap, postgres_kwargs, airflow_db):
    started = time.monotonic()
    suffix = uuid.uuid4().hex[:8]
    topic = create_topic(bootstrap, f"rename_{suffix}", 3)
    old, new, table = f"rename_old_{suffix}", f"rename_new_{suffix}", f"rename_pv_{suffix}"
    cleanup["pipelines"] += [old, new]
    cleanup["postgres"].append(table)
    pg_rows(postgres_kwargs, COUNTS_DDL.format(name=table))
    sink = {"table": table, "key_columns": ["app_id"], "updates": {"pv": "add"}}
    options: dict[str, Any] = {"dedup_key": ["event_id"], "transform": COUNT, "offset_store_conn_id": pg_store}
    first = produce_page_views(bootstrap, 200, topic=topic)
    one = run(operator(topic, PostgresTwoPhaseSink(**sink), old, **options))
    assert one["batch_id"] == 0, one
    second = produce_page_views(bootstrap, 100, topic=topic)
    job = {"topic": topic, "pipeline_id": old, "run_id": f"manual__{uuid.uuid4().hex}",
           "offset_store_conn_id": pg_store, "transform": COUNT, "options": {"dedup_key": ["event_id"]},
           "sink": {"kind": "PostgresTwoPhaseSink", **sink}}
    # Killed once its batch is planned (before Spark starts: a cheap child), the batch stays in doubt.
    crashed = run_child(["-m", "tests.support.operator_child", json.dumps(job)], fault="after_plan")
    assert crashed.returncode == -signal.SIGKILL, f"not killed after planning: {why(crashed)}"
    killed_done = time.monotonic()

    ops = pipeline_operations(pg_store)
    lifecycle = PipelineLifecycle(ops)
    with pytest.raises(OperationError, match="may have a run going on: batch 1 is planned"):
        lifecycle.rename(old, new, apply=True, reason="DAG renamed")  # killed seconds ago: could be running
    with pytest.raises(OperationError, match=f"has work in doubt .*batch 1 is planned.*airflow eo recover {old}"):
        lifecycle.rename(old, new, apply=True, reason="DAG renamed", idle_s=0)
    recovered = ops.recover(old, apply=True, reason="before its rename")
    assert [(b.record.batch_id, b.action.value) for b in recovered.batches] == [(1, "abort")]
    assert lifecycle.rename(old, new).refusal is None  # the recover's epoch is nobody's run

    done = eo("rename", old, new, "--apply", "--reason", "DAG renamed", "--offset-store-conn-id", pg_store,
              "-o", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["sink_rows"][SEEN_ID_TABLE] == 200 and report["epoch"] is not None, report
    assert not ops.store.pipelines(old) and ops.store.pipeline(new).epoch == report["epoch"]
    assert [b.record.state.value for b in reversed(ops.store.batch_history(new, 10))] == ["committed", "aborted"]

    three = run(operator(topic, PostgresTwoPhaseSink(**sink), new, **options))
    assert (three["batch_id"], three["records_in"]) == (2, 100), three  # exactly where the old id stopped
    assert dict(pg_rows(postgres_kwargs, f"SELECT app_id, pv FROM {table}")) == pv_of(first + second)
    seen = pg_rows(postgres_kwargs, f"SELECT pipeline_key, COUNT(*) FROM {SEEN_ID_TABLE} WHERE pipeline_key IN "
                                    "(%s, %s) GROUP BY pipeline_key", (seen_pipeline_key(old), seen_pipeline_key(new)))
    assert {bytes(k): n for k, n in seen} == {seen_pipeline_key(new): 300}
    owners = pg_rows(postgres_kwargs, f"SELECT pipeline_key, pipeline_id FROM {OWNER_TABLE} WHERE pipeline_key IN "
                                      "(%s, %s)", (seen_pipeline_key(old), seen_pipeline_key(new)))
    assert [(bytes(k), p) for k, p in owners] == [(seen_pipeline_key(new), new)], "the owner row moves with the id"
    kafka = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    assert kafka.group_offsets(new, [(topic, p) for p in range(3)]) == ops.store.committed_offsets(new)
    audit = [a.action for a in ops.store.audit_log(new, 10)]
    assert audit[:2] == ["rename", "recover"], audit
    renamed_done = time.monotonic()

    # Moved to another store (MariaDB's, the default): retired here, seeded there with its committed offsets under a
    # new id, as docs/how-to/retire-and-rename.md shows; its first batch there reads exactly the records after them.
    retired = lifecycle.retire(new, apply=True, reason="moved to the MariaDB store")
    assert retired.epoch is not None and nonzero(retired.removed) == {SEEN_ID_TABLE: 300, OWNER_TABLE: 1}, retired
    offsets = ops.store.committed_offsets(new)
    moved = f"rename_moved_{suffix}"
    cleanup["pipelines"].append(moved)
    partial = PipelineLifecycle(pipeline_operations()).seed(moved, {(topic, 0): offsets[(topic, 0)]})
    assert partial.refusal is not None and f"{topic}[1], {topic}[2]" in partial.refusal
    spelled = {topic: {str(p): o for (_, p), o in sorted(offsets.items())}}
    done = eo("seed", moved, "--to-offsets", json.dumps(spelled), "--apply", "--reason", "moved from the PG store",
              "-o", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    third = produce_page_views(bootstrap, 50, topic=topic)
    options.pop("offset_store_conn_id")
    four = run(operator(topic, PostgresTwoPhaseSink(**sink), moved, **options))
    assert (four["batch_id"], four["records_in"]) == (0, 50), four
    assert dict(pg_rows(postgres_kwargs, f"SELECT app_id, pv FROM {table}")) == pv_of(first + second + third)
    checked = pipeline_operations().verify(moved)  # the seed is an audited start: its batches tile from there
    assert [f for f in checked.findings if f.check.value in ("tiling", "mirror")] == [], checked.findings
    with pytest.raises(RetiredPipelineError):
        run(operator(topic, PostgresTwoPhaseSink(**sink), new, **{**options, "offset_store_conn_id": pg_store}))
    print(f"two runs of the old id {killed_done - started:.1f}s, recover, rename and the new id's run "
          f"{renamed_done - killed_done:.1f}s, the move {time.monotonic() - renamed_done:.1f}s")
