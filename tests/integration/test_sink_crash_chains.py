"""Exactly-once under SIGKILL, written once for every registered SQL table sink kind (MySQL's XA and upsert sinks,
PostgreSQL's two-phase and upsert sinks, and any database registered later): a run of the real operator (real
Kafka, Spark and database, in a child process) is killed at each protocol step the kind passes, the same run again
meets the next step; then that run again and, after more events, a later run (both in the test's process). The
table must equal the ground truth read straight from the topic, no prepared branch may be left, and the committed
batches must tile the topic to its end.

A two-phase kind counts page views per app (``add`` updates, with the offset store on MySQL); an upsert kind writes
the events by id, fenced by the offset store on its own database. A kind's database is reached through its
descriptor (:class:`~airflow_eo.sqlsink.database.SqlDatabase`): nothing below names a database.

The kinds of :data:`DEDUP_KINDS` (one two-phase and one upsert kind, one per database) run with
``dedup_key=["event_id"]`` on a topic where the producer re-sent events (within a batch, across batches and into
other partitions): each event must count once, the copies dropped by the committed batches must add up to the copies
sent, and the seen-id table must hold each event once. The other kinds run without it: every path once, no chain
twice (suite time)."""

from __future__ import annotations

import json
import os
import signal
import uuid
from typing import Any

import pytest

from airflow_eo.core.sink_kinds import sink_kind
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.sinks import SINK_KINDS
from airflow_eo.sqlsink.specs import SqlTableSinkSpec
from examples.page_views import ground_truth, produce_page_views, resend_page_views
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.operator_harness import run_job
from tests.support.page_views import assert_contiguous, run_child
from tests.support.postgres import COUNTS_DDL, EVENTS_DDL, PG_STORE, store_batches
from tests.support.seen_ids import seen_rows
from tests.support.sql import database_query
from tests.support.stores import MYSQL_STORE

# after_plan comes before any sink code runs: the two-phase chains cover it.
TWO_PHASE_POINTS = ["after_plan", "during_write", "after_prepare", "in_store_commit", "after_commit_point",
                    "between_xa_commits"]
UPSERT_POINTS = ["during_write", "in_store_commit", "after_commit_point"]

#: The offset store on a connection type's database (the stack's), for the fenced upsert kinds.
STORES = {"mysql": MYSQL_STORE, "postgres": PG_STORE}
#: The store connection this test makes (the stack's PostgreSQL database, under the PG_STORE id).
STORE_ENV = {f"AIRFLOW_CONN_{PG_STORE.upper()}": "AIRFLOW_CONN_POSTGRES_DEFAULT"}

SQL_KINDS = sorted(name for name, spec in SINK_KINDS.items() if issubclass(spec, SqlTableSinkSpec))
#: The kinds whose chain runs with dedup_key on a topic with re-sent events.
DEDUP_KINDS = {"MySqlXaSink", "PostgresUpsertSink"}


def test_every_sql_sink_kind_is_covered():
    assert {"MySqlXaSink", "MySqlUpsertSink", "PostgresTwoPhaseSink", "PostgresUpsertSink"} <= set(SQL_KINDS)


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_the_sink_survives_sigkill_at_every_step(kind, bootstrap, mysql_kwargs, postgres_kwargs, airflow_db,
                                                  monkeypatch):
    env = {name: os.environ[source] for name, source in STORE_ENV.items()}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # this process reads the store too
    spec_class = SINK_KINDS[kind]
    capabilities = sink_kind(kind).capabilities
    two_phase = capabilities.in_doubt_branches
    topic = create_topic(bootstrap, f"chain_{uuid.uuid4().hex[:8]}", 3)
    pipeline = f"chain_{kind}_{topic}"
    table = f"{'app_pv' if two_phase else 'pv_events'}_{uuid.uuid4().hex[:8]}"
    sink_options: dict[str, Any] = ({"table": table, "key_columns": ["app_id"], "updates": {"pv": "add"}}
                                    if two_phase else {"table": table, "key_columns": ["event_id"]})
    store = MYSQL_STORE if two_phase else STORES[capabilities.connection_type]
    adapter = build_sink(spec_class(**sink_options), pipeline, store)
    database, connect_kwargs = adapter.database, adapter.connect_kwargs  # type: ignore[attr-defined]
    query = database_query(database, connect_kwargs)
    query((COUNTS_DDL if two_phase else EVENTS_DDL).format(name=table))

    def prepared() -> list[str]:
        with database.two_phase_session(connect_kwargs) as branches:
            return [x.encode() for x in branches.recover(pipeline)]

    def batches() -> list[dict[str, Any]]:
        return store_batches(store, postgres_kwargs, mysql_kwargs, pipeline)

    job = {"topic": topic, "pipeline_id": pipeline, "offset_store_conn_id": store,
           "sink": {"kind": kind, **sink_options}}
    if two_phase:
        job["transform"] = "airflow_eo.examples.page_views.count_per_app"
    dedup = kind in DEDUP_KINDS
    if dedup:
        job["options"] = {"dedup_key": ["event_id"]}
    produced: list[dict[str, Any]] = []
    copies = 0

    def produce(count: int) -> None:
        nonlocal copies
        produced.extend(produce_page_views(bootstrap, count, topic=topic))
        if dedup:  # copies of this wave's and of earlier waves' events
            copies += len(resend_page_views(bootstrap, produced, count // 5, topic=topic))

    def child(run_id: str, fault: str | None = None) -> Any:
        return run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})],
                         fault=fault, env=env)

    OffsetStoreHook(store).get_store().migrate()  # its tables exist before the first batch is read back
    produce(600)
    run_id = f"manual__{uuid.uuid4().hex}"
    points = TWO_PHASE_POINTS if two_phase else UPSERT_POINTS
    if dedup:  # the seen ids written, the output not: a two-phase kind rolls them back, an upsert kind keeps them
        points = [points[0], "after_seen_ids", *points[1:]]
    for point in points:
        found = batches()
        if found and found[-1]["state"] == "committed":
            run_id = f"manual__{uuid.uuid4().hex}"  # that run committed: the next crash kills a new one
        crashed = child(run_id, point)
        assert crashed.returncode == -signal.SIGKILL, f"the run was not killed at {point}: {why(crashed)}"
        assert batches(), "the batch row must be written before the crash point"
        if point == "after_prepare":
            assert prepared(), "the crash should leave prepared branches"
            assert query(f"SELECT * FROM {table}") == [], "nothing may be visible before the commit point"
        if point in ("after_prepare", "after_commit_point"):  # `airflow eo status` lists them, with the decision
            in_doubt = pipeline_operations(store, "kafka_default").status(pipeline).in_doubt
            left = prepared()
            assert sorted(b.decision.xid for b in in_doubt) == sorted(left)
            assert bool(left) is two_phase
            expected = "rollback" if point == "after_prepare" else "commit"
            assert {b.decision.action.value for b in in_doubt} <= {expected}
        produce(100)

    # The runs that must succeed run here, in this process's warm Spark session (a child costs ~15 s of start-up).
    run_job({**job, "run_id": run_id})  # the same run again: resume, or return the committed summary
    produce(200)
    run_job({**job, "run_id": "later"})

    assert prepared() == [], "prepared branches were left behind"
    found = batches()
    assert_contiguous(found)
    pv_per_app, event_ids, ends = ground_truth(bootstrap, topic, per_event=dedup)
    committed: dict[int, int] = {}
    for batch in found:
        if batch["state"] == "committed":
            committed.update({r["partition"]: r["until_offset"] for r in batch["ranges"]})
    assert committed == ends, "the committed batches do not reach the end of the topic"
    if two_phase:
        assert {r["app_id"]: r["pv"] for r in query(f"SELECT app_id, pv FROM {table}")} == pv_per_app
    else:
        written = [r["event_id"] for r in query(f"SELECT event_id FROM {table}")]
        assert len(written) == len(event_ids) and set(written) == event_ids
        assert adapter.store_kwargs is not None  # type: ignore[attr-defined]  # fenced by the store's epoch
    status = pipeline_operations(store, "kafka_default").status(pipeline)
    assert status.in_doubt == [] and status.unfinished == []
    dropped = sum(b["summary"]["duplicates"] for b in found if b["state"] == "committed")
    if dedup:
        assert copies and dropped == copies, f"the committed batches dropped {dropped} copies of the {copies} sent"
        assert len(seen_rows(database, connect_kwargs, pipeline)) == len(event_ids), \
            "the seen-id table must hold each event once"
    else:
        assert dropped == 0
