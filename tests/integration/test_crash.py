"""Exactly-once under SIGKILL: the DAG's process is killed at each protocol step, then runs go on.

After each crash the same run again (a retry/clear) meets the next crash point; then more events
and a new run. The sink must equal the ground truth read straight from the topic, no prepared XA branch of ours may be
left, and the committed offsets must tile the topic up to its end.
"""

from __future__ import annotations

import signal
from datetime import datetime, timezone

from examples.page_views import produce_page_views
from tests.integration.operator_harness import rows
from tests.integration.page_views import (
    UPSERT_PIPELINE,
    XA_PIPELINE,
    assert_exactly_once,
    batch_rows,
    hour,
    hours_truth,
    our_prepared_branches,
    produce_hours,
    reset,
    run_dag,
    sink_state,
)
from tests.support.children import why
from tests.support.kafka import create_topic

XA_POINTS = ["after_plan", "during_write", "after_prepare", "in_store_commit", "after_commit_point",
             "between_xa_commits"]
# after_plan is before any sink code runs: the XA chain covers it for both sinks.
UPSERT_POINTS = ["during_write", "in_store_commit", "after_commit_point"]


def crash_at_every_point(dag_id: str, pipeline: str, points: list[str], bootstrap: str, mysql_kwargs: dict) -> None:
    """One run SIGKILLed at each point in turn, each crash met by the next attempt's recovery.

    The same run is retried (Airflow's retry/clear: it resumes its batch) until a crash falls after its
    commit point; the next point then kills a new run. Each crash is checked where it fell; at the end
    the same run once more, more events and a later run must leave sink = ground truth.
    """
    reset(mysql_kwargs, pipeline)
    produce_page_views(bootstrap, 3000)
    logical_date = datetime.now(timezone.utc)
    for point in points:
        batches = batch_rows(mysql_kwargs, pipeline)
        if batches and batches[-1]["state"] == "committed":
            logical_date = datetime.now(timezone.utc)  # that run committed: the next crash kills a new one
        crashed = run_dag(dag_id, logical_date, fault=point)
        assert crashed.returncode == -signal.SIGKILL, (
            f"the run was not killed at {point}: rc={crashed.returncode}\n{why(crashed)}")
        assert batch_rows(mysql_kwargs, pipeline), "the batch row must be written before the crash point"
        if point == "after_prepare":
            assert our_prepared_branches(mysql_kwargs, pipeline), "the crash should leave prepared branches"
            assert sink_state(mysql_kwargs)[0] == {}, "nothing may be visible before the commit point"
        produce_page_views(bootstrap, 300)

    retried = run_dag(dag_id, logical_date)  # the same run again: resume or return the committed summary
    assert retried.returncode == 0, why(retried)
    produce_page_views(bootstrap, 700)
    later = run_dag(dag_id)  # a later run
    assert later.returncode == 0, why(later)
    assert_exactly_once(mysql_kwargs, bootstrap, pipeline)


def test_xa_sink_survives_sigkill_at_every_step(bootstrap, mysql_kwargs, airflow_db):
    crash_at_every_point("page_views_xa", XA_PIPELINE, XA_POINTS, bootstrap, mysql_kwargs)


def test_upsert_sink_survives_sigkill_at_every_step(bootstrap, mysql_kwargs, airflow_db):
    crash_at_every_point("page_view_events_upsert", UPSERT_PIPELINE, UPSERT_POINTS, bootstrap, mysql_kwargs)


def test_hourly_interval_dag_survives_sigkill_and_replays_the_same_hour(bootstrap, mysql_kwargs, airflow_db,
                                                                       topic_name):
    """page_view_events_hourly (interval mode) killed while its executors write, then the hour again."""
    create_topic(bootstrap, topic_name, 3)
    events = produce_hours(bootstrap, topic_name, [200, 300, 60])  # hour 2 ends hour 1 on every partition
    pipeline, conf = f"page_view_events_hourly.{topic_name}", {"topic": topic_name}
    ours = f"SELECT event_id FROM page_view_events_hourly WHERE event_id IN ({', '.join(['%s'] * len(events))})"

    def sink_ids() -> set[str]:
        return {r[0] for r in rows(mysql_kwargs, ours, tuple(e["event_id"] for e in events))}

    # dag.test infers the manual data interval from the logical date: the hour that ends there.
    crashed = run_dag("page_view_events_hourly", hour(1)[1], fault="during_write", conf=conf)
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    assert [b["state"] for b in batch_rows(mysql_kwargs, pipeline)] == ["planned"]

    retried = run_dag("page_view_events_hourly", hour(1)[1], conf=conf)  # the same run again
    assert retried.returncode == 0, why(retried)
    assert sink_ids() == hours_truth(events, 1)
    earlier = run_dag("page_view_events_hourly", hour(0)[1], conf=conf)  # a backfilled earlier hour
    assert earlier.returncode == 0, why(earlier)
    assert sink_ids() == hours_truth(events, 0, 1)
    h0, h1 = sorted((b["ranges"] for b in batch_rows(mysql_kwargs, pipeline)), key=lambda r: r[0]["from_offset"])
    assert [r["until_offset"] for r in h0] == [r["from_offset"] for r in h1]
