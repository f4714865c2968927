"""End to end: the example DAGs under dag.test(), several runs with new events between them."""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg
import pytest

from examples.page_views import TOPIC, ground_truth, produce_page_views
from examples.state import pg_prepared_transactions, reset_page_views_pg
from tests.integration.page_views import (
    UPSERT_PIPELINE,
    XA_PIPELINE,
    assert_exactly_once,
    batch_rows,
    reset,
    run_dag,
)
from tests.support.children import why
from tests.support.lineage import assert_batch_lineage, completes, file_transport


@pytest.mark.parametrize(("dag_id", "pipeline", "task", "table"), [
    ("page_views_xa", XA_PIPELINE, "count_page_views", "app_pv"),
    ("page_view_events_upsert", UPSERT_PIPELINE, "store_page_view_events", "page_view_events")])
def test_several_runs_with_new_events_between_them(dag_id, pipeline, task, table, bootstrap, mysql_kwargs, airflow_db,
                                                    tmp_path):
    reset(mysql_kwargs, pipeline)
    produce_page_views(bootstrap, 500)
    lineage = tmp_path / "openlineage.json"
    for new_events in (300, 0, 0):  # new events, then none: the third run finds nothing to read
        done = run_dag(dag_id, env=file_transport(lineage))
        assert done.returncode == 0, why(done)
        assert_exactly_once(mysql_kwargs, bootstrap, pipeline)
        if new_events:
            produce_page_views(bootstrap, new_events)
    batches = batch_rows(mysql_kwargs, pipeline)
    assert [b["state"] for b in batches] == ["committed"] * 3
    # The run with no new events committed an empty batch (offsets unchanged).
    assert all(r["from_offset"] == r["until_offset"] for r in batches[2]["ranges"])
    # Each run's COMPLETE event, as Airflow's OpenLineage provider sent it through its file transport.
    sent = completes(lineage, f"{dag_id}.{task}")
    assert len(sent) == 3
    facets = [assert_batch_lineage(e, [(f"kafka://{bootstrap}", TOPIC)],
                                   (f"mysql://{mysql_kwargs['host']}:{mysql_kwargs['port']}",
                                    f"{mysql_kwargs['database']}.{table}"), pipeline) for e in sent]
    assert [f["batchId"] for f in facets] == [b["batch_id"] for b in batches]
    assert facets[0]["recordsIn"] >= 500 and [f["recordsIn"] for f in facets[1:]] == [300, 0]  # the shared topic


def test_cleared_committed_run_returns_its_summary_and_does_nothing(bootstrap, mysql_kwargs, airflow_db):
    reset(mysql_kwargs, XA_PIPELINE)
    produce_page_views(bootstrap, 100)
    logical_date = datetime.now(timezone.utc)
    first = run_dag("page_views_xa", logical_date)
    assert first.returncode == 0, why(first)
    truth = assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)
    produce_page_views(bootstrap, 50)
    again = run_dag("page_views_xa", logical_date)  # same logical date = the same run, cleared
    assert again.returncode == 0, why(again)
    assert "already committed" in again.stdout + again.stderr
    assert len(batch_rows(mysql_kwargs, XA_PIPELINE)) == 1
    from tests.integration.page_views import sink_state

    assert sink_state(mysql_kwargs)[0] == truth.pv_per_app  # the 50 new events wait for the next run


def test_page_views_pg_counts_each_event_once_all_on_postgres(bootstrap, postgres_kwargs, airflow_db, tmp_path):
    """The two-phase sink and the offset store in one PostgreSQL database."""
    reset_page_views_pg(postgres_kwargs)
    produce_page_views(bootstrap, 400)
    lineage = tmp_path / "openlineage.json"
    done = run_dag("page_views_pg", env=file_transport(lineage))  # one run (the crash chains run more)
    assert done.returncode == 0, why(done)
    [sent] = completes(lineage, "page_views_pg.count_page_views")
    assert_batch_lineage(sent, [(f"kafka://{bootstrap}", TOPIC)],
                         (f"postgres://{postgres_kwargs['host']}:{postgres_kwargs['port']}",
                          f"{postgres_kwargs['dbname']}.public.app_pv"), "page_views_pg")
    pv_per_app, _, ends = ground_truth(bootstrap, TOPIC)
    with psycopg.connect(**postgres_kwargs) as conn:
        assert dict(conn.execute("SELECT app_id, pv FROM app_pv").fetchall()) == pv_per_app
        assert dict(conn.execute("SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                                 ("page_views_pg",)).fetchall()) == ends
        assert conn.execute("SELECT state FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
                            ("page_views_pg",)).fetchall() == [("committed",)]
    assert pg_prepared_transactions(postgres_kwargs, "page_views_pg") == []
