"""End to end: the example DAGs under dag.test(), several runs with new events between them."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from examples.page_views import produce_page_views
from tests.integration.page_views import (
    UPSERT_PIPELINE,
    XA_PIPELINE,
    assert_exactly_once,
    batch_rows,
    reset,
    run_dag,
)


@pytest.mark.parametrize(("dag_id", "pipeline"), [("page_views_xa", XA_PIPELINE),
                                                  ("page_view_events_upsert", UPSERT_PIPELINE)])
def test_several_runs_with_new_events_between_them(dag_id, pipeline, bootstrap, mysql_kwargs, airflow_db):
    reset(mysql_kwargs, pipeline)
    produce_page_views(bootstrap, 500)
    for new_events in (300, 0, 200):
        done = run_dag(dag_id)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert_exactly_once(mysql_kwargs, bootstrap, pipeline)
        if new_events:
            produce_page_views(bootstrap, new_events)
    done = run_dag(dag_id)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_exactly_once(mysql_kwargs, bootstrap, pipeline)
    batches = batch_rows(mysql_kwargs, pipeline)
    assert [b["state"] for b in batches] == ["committed"] * 4
    # The run with no new events committed an empty batch (offsets unchanged).
    assert all(r["from_offset"] == r["until_offset"] for r in batches[2]["ranges"])


def test_cleared_committed_run_returns_its_summary_and_does_nothing(bootstrap, mysql_kwargs, airflow_db):
    reset(mysql_kwargs, XA_PIPELINE)
    produce_page_views(bootstrap, 100)
    logical_date = datetime.now(timezone.utc)
    first = run_dag("page_views_xa", logical_date)
    assert first.returncode == 0, first.stderr[-3000:]
    truth = assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)
    produce_page_views(bootstrap, 50)
    again = run_dag("page_views_xa", logical_date)  # same logical date = the same run, cleared
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already committed" in again.stdout + again.stderr
    assert len(batch_rows(mysql_kwargs, XA_PIPELINE)) == 1
    from tests.integration.page_views import sink_state

    assert sink_state(mysql_kwargs)[0] == truth.pv_per_app  # the 50 new events wait for the next run
