"""PostgreSQL crashes mid-batch: a postmaster SIGKILLed at each step of a batch, then restarted on its data, with the
offset store and the sink on one server (the stack's) and on two (the store on a second server).

Each step's attempt must fail (naming where the batch stands) without hanging, or, when the killed server has no
part left in the batch, succeed; prepared transactions survive the restart and are resolved by the next attempt; then
the same run again, more input and a later run leave the sink equal to the ground truth read from the topic, no
prepared transaction on either server, and contiguous committed batches.

On two servers the step kills the server that step talks to: the sink's while its tasks write and once its
transactions are prepared (the store then commits without it, and ``COMMIT PREPARED`` finds the sink gone); the
store's inside its commit (the sink's prepared transactions are then in doubt) and after the commit point (the batch
must stay committed across the store's crash while the sink's commit goes on). The upsert sink runs on one server (its
writes fenced by the store's epoch in the same database) and on two, where they are not fenced (the epoch is a row of
the store's database), so its replays alone must keep it exact.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.failpoints import fired
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.hooks.postgres import EoPostgresHook
from airflow_eo.sinks import PostgresTwoPhaseSink, PostgresUpsertSink
from examples import page_views
from tests.support.faults import Faults, gone
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, run
from tests.support.page_views import assert_contiguous
from tests.support.postgres import COUNTS_DDL, EVENTS_DDL, PG_STORE, pg_rows, pg_table, prepared_gids

# The upsert sink has nothing to do after its commit point: a store killed there is the two-phase chain's case.
STEPS = {"two_phase": ["during_write", "after_prepare", "in_store_commit", "after_commit_point"],
         "upsert": ["during_write", "in_store_commit"]}
# The server each step kills when store and sink are on two servers (see the module's docstring).
KILLS_STORE = {"in_store_commit", "after_commit_point"}
# What an attempt says when its server is gone (psycopg's errors, through Spark's for executors).
DATABASE_LOST = re.compile(r"unexpected postmaster exit|Connection refused|server closed the connection")
ATTEMPT_SECONDS = 90


@pytest.mark.parametrize(("kind", "layout"), [("two_phase", "one_server"), ("two_phase", "two_servers"),
                                              ("upsert", "one_server"), ("upsert", "two_servers")])
def test_postgres_crashing_at_every_step(kind, layout, stack: ModuleType, faults: Faults, bootstrap, postgres_kwargs,
                                         topic_name, request, monkeypatch):
    sink_pid_file: Path = stack.PID_FILES["postgres"]
    if layout == "two_servers":
        second = request.getfixturevalue("second_postgres")
        monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", f"postgresql://{second['user']}:{second['password']}@"
                                                               f"127.0.0.1:{second['port']}/{second['database']}")
        store_pid_file: Path = stack.SECOND_POSTGRES / "postgres.pid"
    else:
        monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
        store_pid_file = sink_pid_file
    store_kwargs: dict[str, Any] = EoPostgresHook(PG_STORE).get_connect_kwargs()
    OffsetStoreHook(PG_STORE).get_store().migrate()  # a fresh second server has no store tables before the first take
    create_topic(bootstrap, topic_name, 3)
    page_views.produce_page_views(bootstrap, 2000, topic=topic_name)
    if kind == "two_phase":
        table = pg_table(postgres_kwargs, COUNTS_DDL, "app_pv")
        spec: PostgresUpsertSink = PostgresTwoPhaseSink(table=table, key_columns=["app_id"], updates={"pv": "add"})
        op = operator(topic_name, spec, transform=page_views.count_per_app, offset_store_conn_id=PG_STORE)
    else:
        table = pg_table(postgres_kwargs, EVENTS_DDL, "pv_events")
        spec = PostgresUpsertSink(table=table, key_columns=["event_id"])
        op = operator(topic_name, spec, offset_store_conn_id=PG_STORE)
        if layout == "two_servers":
            # What the code does: the store's epoch is a row of the store's database, so no fence on another server.
            sink = build_sink(spec, op.pipeline_id, PG_STORE)
            assert sink.epoch_fence(BatchContext(op.pipeline_id, 0, "r", 1, ())) is None  # type: ignore[attr-defined]
    run_id = f"manual__{uuid.uuid4().hex}"

    def batches() -> list[tuple]:
        return pg_rows(store_kwargs, "SELECT batch_id, state, ranges, run_id FROM eo_batch WHERE pipeline_id = %s "
                       "ORDER BY batch_id", (op.pipeline_id,))

    for step in STEPS[kind]:
        found = batches()
        if found and found[-1][1] == "committed" and found[-1][3] == run_id:
            run_id = f"manual__{uuid.uuid4().hex}"  # that run committed: the next crash kills a new one
        pid_file = store_pid_file if step in KILLS_STORE else sink_pid_file
        server = int(pid_file.read_text())
        started = time.monotonic()
        error: BaseException | None = None
        with faults.kill_at(step, pid_file) as fault_dir:
            try:
                run(op, run_id)
            except Exception as exc:  # the attempt's error is what is checked
                error = exc
        seconds = time.monotonic() - started
        trace = f"\nfailpoint trace: {fired(str(fault_dir))}"
        assert gone(server), f"{step}: the fault did not kill PostgreSQL; {error!r}"[:3000] + trace
        if pid_file == sink_pid_file:  # first, so that a failed check below leaves no server down for the next test
            stack.start("postgres")
        else:
            stack.second_postgres_up()
        assert seconds < ATTEMPT_SECONDS, f"{step}: the attempt took {seconds:.0f}s with its database gone" + trace
        # Where the failed attempt says the batch stands; None: the killed server had no part left in it.
        where = {"during_write": "before", "in_store_commit": "at",
                 # on one server the store's commit fails with the sink; on two it commits without the sink
                 "after_prepare": "at" if layout == "one_server" else "after",
                 # on one server COMMIT PREPARED finds the server gone; on two (the store's killed) it runs
                 "after_commit_point": "after" if layout == "one_server" else None}[step]
        if where is None:
            assert error is None, f"{step}: the sink's server was there, yet the attempt failed: {error!r}" + trace
        else:
            assert error is not None, f"{step}: the attempt went on as if its database were there" + trace
            assert DATABASE_LOST.search(str(error)), f"{step}: unclear error: {str(error)[-2000:]}" + trace
            assert any(f"failed {where} its commit point" in note for note in getattr(error, "__notes__", [])), (
                f"{step}: the error does not say where the batch stands: {getattr(error, '__notes__', None)} "
                f"{str(error)[-1500:]}" + trace)
        # In doubt: prepared before the kill, not yet committed by the attempt (on two servers after the commit
        # point the attempt committed them before it ended).
        # During the write: none, or one of another task that prepared while the server died. A SIGKILLed
        # postmaster's backends finish the statement they run before they notice (seen once in CI: the other task's
        # PREPARE TRANSACTION went through); the next attempt rolls it back, as the end of this test checks.
        in_doubt = kind == "two_phase" and step != "during_write" and where is not None
        if step != "during_write":
            assert bool(prepared_gids(postgres_kwargs, op.pipeline_id)) is in_doubt, (
                f"{step}: prepared transactions {'do not ' if in_doubt else ''}survive the restart")
        # The store's state after the restart is what the attempt said: committed when after its commit point.
        assert (batches()[-1][1] == "committed") is (where in ("after", None)), f"{step}: {batches()[-1]}"
        page_views.produce_page_views(bootstrap, 300, topic=topic_name)

    run(op, run_id)  # the same run again (Airflow's retry): recovers, or returns the committed batch
    page_views.produce_page_views(bootstrap, 500, topic=topic_name)
    run(op)  # a later run reads everything after that batch

    pv_per_app, event_ids, end_offsets = page_views.ground_truth(bootstrap, topic_name)
    if kind == "two_phase":
        assert dict(pg_rows(postgres_kwargs, f"SELECT app_id, pv FROM {table}")) == pv_per_app
    else:
        written = [r[0] for r in pg_rows(postgres_kwargs, f"SELECT event_id FROM {table}")]
        assert len(written) == len(event_ids) and set(written) == event_ids
    for server_kwargs in (postgres_kwargs, store_kwargs):
        assert prepared_gids(server_kwargs, op.pipeline_id) == [], "prepared transactions were left behind"
    found = [{"batch_id": b, "state": s, "ranges": json.loads(r) if isinstance(r, str) else r}
             for b, s, r, _ in batches()]
    assert_contiguous(found)
    offsets = dict(pg_rows(store_kwargs, "SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                           (op.pipeline_id,)))
    assert offsets == end_offsets, "committed offsets are not at the end of the topic"
