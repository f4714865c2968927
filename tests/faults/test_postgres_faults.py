"""PostgreSQL crashes mid-batch: the postmaster SIGKILLed at each step of a two-phase batch, then restarted on its
data, with the offset store and the sink on that one server.

Each step's attempt must fail (naming where the batch stands) without hanging; prepared transactions survive the
restart and are resolved by the next attempt; then the same run again, more input and a later run leave the counts
equal to the ground truth read from the topic, no prepared transaction, and contiguous committed batches.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from types import ModuleType

from airflow_eo.core.failpoints import fired
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.sinks import PostgresTwoPhaseSink
from examples import page_views
from tests.conftest import create_topic
from tests.faults.conftest import Faults, gone
from tests.integration.operator_harness import operator, run
from tests.integration.page_views import assert_contiguous
from tests.integration.test_postgres_sinks import COUNTS_DDL, PG_STORE, pg_rows, pg_table, prepared_gids

STEPS = ["during_write", "after_prepare", "in_store_commit", "after_commit_point"]
ATTEMPT_SECONDS = 90


def test_postgres_crashing_at_every_step_with_store_and_sink_on_it(stack: ModuleType, faults: Faults, bootstrap,
                                                                    postgres_kwargs, topic_name, monkeypatch):
    monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    OffsetStoreHook(PG_STORE).get_store().migrate()
    pid_file: Path = stack.PID_FILES["postgres"]
    create_topic(bootstrap, topic_name, 3)
    page_views.produce_page_views(bootstrap, 2000, topic=topic_name)
    table = pg_table(postgres_kwargs, COUNTS_DDL, "app_pv")
    sink = PostgresTwoPhaseSink(table=table, key_columns=["app_id"], updates={"pv": "add"})
    op = operator(topic_name, sink, transform=page_views.count_per_app, offset_store_conn_id=PG_STORE)
    run_id = f"manual__{uuid.uuid4().hex}"

    def batches() -> list[tuple]:
        return pg_rows(postgres_kwargs, "SELECT batch_id, state, ranges, run_id FROM eo_batch WHERE pipeline_id = %s "
                       "ORDER BY batch_id", (op.pipeline_id,))

    for step in STEPS:
        found = batches()
        if found and found[-1][1] == "committed" and found[-1][3] == run_id:
            run_id = f"manual__{uuid.uuid4().hex}"  # that run committed: the next crash kills a new one
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
        assert seconds < ATTEMPT_SECONDS, f"{step}: the attempt took {seconds:.0f}s with its database gone" + trace
        assert error is not None, f"{step}: the attempt went on as if its database were there" + trace
        where = {"during_write": "before", "after_prepare": "at", "in_store_commit": "at",
                 "after_commit_point": "after"}[step]
        assert any(f"failed {where} its commit point" in note for note in getattr(error, "__notes__", [])), (
            f"{step}: the error does not say where the batch stands: {getattr(error, '__notes__', None)} "
            f"{str(error)[-1500:]}" + trace)
        stack.start("postgres")
        if step in ("after_prepare", "after_commit_point"):
            assert prepared_gids(postgres_kwargs, op.pipeline_id), f"{step}: prepared transactions survive a restart"
        page_views.produce_page_views(bootstrap, 300, topic=topic_name)

    run(op, run_id)  # the same run again (Airflow's retry): recovers, or returns the committed batch
    page_views.produce_page_views(bootstrap, 500, topic=topic_name)
    run(op)  # a later run reads everything after that batch

    pv_per_app, _, end_offsets = page_views.ground_truth(bootstrap, topic_name)
    assert dict(pg_rows(postgres_kwargs, f"SELECT app_id, pv FROM {table}")) == pv_per_app
    assert prepared_gids(postgres_kwargs, op.pipeline_id) == [], "prepared transactions were left behind"
    found = [{"batch_id": b, "state": s, "ranges": json.loads(r) if isinstance(r, str) else r}
             for b, s, r, _ in batches()]
    assert_contiguous(found)
    offsets = dict(pg_rows(postgres_kwargs, "SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                           (op.pipeline_id,)))
    assert offsets == end_offsets, "committed offsets are not at the end of the topic"
