"""Exactly-once under SIGKILL through the example DAGs (``dag.test()`` in a child process): the hourly interval
DAG killed while its executors write, then the hour again and a backfilled one. The chains of a SIGKILL at every
protocol step, for every SQL sink kind, are ``test_sink_crash_chains.py``."""

from __future__ import annotations

import signal

from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.operator_harness import rows
from tests.support.page_views import (
    batch_rows,
    hour,
    hours_truth,
    produce_hours,
    run_dag,
)


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
