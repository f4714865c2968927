"""Interval mode against the real stack: each batch is exactly the records of its data interval.

Events are produced with Kafka timestamps in fixed past hours (ascending, as a producer
replaying history would). The ground truth of an hour is the events whose own timestamp
falls in it, computed from what was produced, not from offsets.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer

from airflow_eo.core.batch import BatchSummary, Owner
from airflow_eo.core.errors import ConfigurationError, FencedError, IntervalNotReadyError, PipelineConflictError
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.hooks.mysql import OffsetStoreHook
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.sinks import MySqlUpsertSink
from examples import page_views
from examples.topics import read_records
from tests.support.kafka import create_topic
from tests.support.operator_harness import events_table, operator, rows, run
from tests.support.page_views import hour, hours_truth, produce_hours, table_rows


def test_intervals_are_exact_contiguous_and_replays_change_nothing(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 3)
    events = produce_hours(bootstrap, topic_name, [40, 60, 30, 60])  # hour 3 ends hour 2 on every partition
    table = events_table(mysql_kwargs)
    op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]), mode="interval")

    later = run(op, "backfill__h1", interval=hour(1))  # out of order, as a backfill may run them
    earlier = run(op, "backfill__h0", interval=hour(0))
    assert (later["mode"], later["interval"]["start"]) == ("interval", hour(1)[0].isoformat())
    assert {r[0] for r in table_rows(mysql_kwargs, table)} == hours_truth(events, 0, 1)
    ends = {r["partition"]: r["until_offset"] for r in earlier["ranges"]}
    assert {r["partition"]: r["from_offset"] for r in later["ranges"]} == ends  # contiguous, no overlap
    assert later["records_in"] == len(hours_truth(events, 1)) and earlier["records_in"] == len(hours_truth(events, 0))

    before = table_rows(mysql_kwargs, table)
    replay = run(op, "scheduled__other_run_same_hour", interval=hour(1))  # a clear / reprocessing backfill
    assert replay["replayed"] and replay["batch_id"] == later["batch_id"] and replay["ranges"] == later["ranges"]
    assert table_rows(mysql_kwargs, table) == before

    run(op, interval=hour(2))
    assert {r[0] for r in table_rows(mysql_kwargs, table)} == hours_truth(events, 0, 1, 2)

    with pytest.raises(IntervalNotReadyError, match="not complete yet"):
        run(op, interval=hour(3))  # nothing at or after 04:00 yet on any partition
    with pytest.raises(ConfigurationError, match="has no data interval"):
        op.execute({"run_id": "manual__no_interval"})
    batches = rows(mysql_kwargs, "SELECT state, interval_start FROM eo_batch WHERE pipeline_id = %s "
                   "ORDER BY interval_start", (op.pipeline_id,))
    assert batches == [("committed", hour(h)[0].replace(tzinfo=None)) for h in (0, 1, 2)]  # hour 3 never planned
    assert {r[0] for r in table_rows(mysql_kwargs, table)} == hours_truth(events, 0, 1, 2)

    # verify of a healthy interval pipeline finds nothing, and its mirror check is not applicable rather than one
    # that could not run (which would make `airflow eo verify` exit 2 on every interval pipeline).
    # (These runs are the harness's, not Airflow's: the runs check has its findings; the others must have none.)
    verified = pipeline_operations(actor="tester@here").verify(op.pipeline_id)
    assert [f for f in verified.findings if f.check.value != "runs"] == [], verified.findings
    assert "mirror: not applicable (an interval-mode pipeline keeps no consumer group)" in verified.checked
    assert not [u for u in verified.unchecked if u.startswith(("mirror", "tiling", "in-doubt"))], verified.unchecked

    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [(f"kafka://{bootstrap}", topic_name)]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [
        (f"mysql://{mysql_kwargs['host']}:{mysql_kwargs['port']}", f"{mysql_kwargs['database']}.{table}")]


def produce_to(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """``counts[p]`` page-view events into partition ``p`` (an idle partition is one we leave out)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, count in counts.items():
        for _ in range(count):
            producer.produce(topic, json.dumps(page_views.page_view()).encode(), partition=partition)
    assert producer.flush(30) == 0


def now_ms() -> datetime:
    moment = datetime.now(timezone.utc)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def stamped_within(bootstrap: str, topic: str, interval: tuple[datetime, datetime]) -> set[str]:
    """Event ids of the records whose Kafka timestamp falls in the interval (read back from the topic)."""
    start, end = (int(t.timestamp() * 1000) for t in interval)
    return {json.loads(r.value)["event_id"] for r in read_records(bootstrap, topic)[0] if start <= r.timestamp_ms < end}


def wait_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(timezone.utc)).total_seconds()))


def test_idle_partitions_close_an_interval_on_a_log_append_time_topic(bootstrap, mysql_kwargs, topic_name):
    """Broker-stamped records: a partition with nothing after the end is closed after the idle timeout,
    and the next interval starts exactly there. The truth is the records' own broker timestamps."""
    create_topic(bootstrap, topic_name, 3, {"message.timestamp.type": "LogAppendTime"})
    idle = timedelta(seconds=3)
    table = events_table(mysql_kwargs)
    sink = MySqlUpsertSink(table=table, key_columns=["event_id"])
    a_start = now_ms() - timedelta(seconds=1)
    produce_to(bootstrap, topic_name, {0: 15, 1: 10, 2: 5})
    a = (a_start, now_ms() + timedelta(milliseconds=1))

    with pytest.raises(IntervalNotReadyError, match="can be closed with idle_partition_timeout"):
        run(operator(topic_name, sink, mode="interval"), interval=a)  # nothing after the end, no timeout
    with pytest.raises(IntervalNotReadyError, match=rf"{topic_name}\[2\] \(last stable offset 5\)"):
        run(operator(topic_name, sink, mode="interval", idle_partition_timeout=3600), interval=a)  # too early
    op = operator(topic_name, sink, mode="interval", idle_partition_timeout=idle)
    wait_until(a[1] + idle)
    first = run(op, interval=a)
    assert [(r["partition"], r["from_offset"], r["until_offset"]) for r in first["ranges"]] == [
        (0, 0, 15), (1, 0, 10), (2, 0, 5)]

    produce_to(bootstrap, topic_name, {0: 12})  # partitions 1 and 2 stay idle
    b = (a[1], now_ms() + timedelta(milliseconds=1))
    wait_until(b[1] + idle)
    second = run(op, interval=b)
    assert [(r["partition"], r["from_offset"], r["until_offset"]) for r in second["ranges"]] == [
        (0, 15, 27), (1, 10, 10), (2, 5, 5)]  # starts where the idle-closed interval ended

    truth_a, truth_b = (stamped_within(bootstrap, topic_name, interval) for interval in (a, b))
    assert (len(truth_a), len(truth_b)) == (30, 12)
    assert {r[0] for r in table_rows(mysql_kwargs, table)} == truth_a | truth_b

    producer_stamped = f"{topic_name}_create_time"
    create_topic(bootstrap, producer_stamped, 1)
    start = now_ms() - timedelta(seconds=1)
    produce_to(bootstrap, producer_stamped, {0: 3})
    c = (start, now_ms() + timedelta(milliseconds=1))
    wait_until(c[1] + idle)
    with pytest.raises(IntervalNotReadyError, match=r"producer timestamps \(CreateTime\)"):
        run(operator(producer_stamped, sink, mode="interval", idle_partition_timeout=idle), interval=c)


def test_concurrent_intervals_fence_only_their_own_attempts(topic_name):
    store = OffsetStoreHook().get_store()
    pipeline = f"iv_{topic_name}"
    a, b = (Interval(*hour(h)) for h in (0, 1))
    old_a = store.take_interval(pipeline, a)
    epoch_b = store.take_interval(pipeline, b)
    batch_a = store.insert_batch(pipeline, old_a, "run-a", [OffsetRange("t", 0, 0, 5)], [], interval=a)
    batch_b = store.insert_batch(pipeline, epoch_b, "run-b", [OffsetRange("t", 0, 5, 9)], [], interval=b)
    new_a = store.take_interval(pipeline, a)  # a newer attempt of interval a (a retry or a zombie's successor)
    with pytest.raises(FencedError, match="interval"):
        store.commit_batch(batch_a, old_a, BatchSummary.of(batch_a, batch_a.run_id, old_a))
    # Interval b is not fenced by interval a's attempts.
    store.commit_batch(batch_b, epoch_b, BatchSummary.of(batch_b, batch_b.run_id, epoch_b))
    adopted_a = store.adopt_batch(batch_a, new_a)
    store.commit_batch(adopted_a, new_a, BatchSummary.of(adopted_a, adopted_a.run_id, new_a))
    assert store.batch_for_interval(pipeline, a).state.value == "committed"
    assert store.committed_offsets(pipeline) == {}  # interval batches move no running position


def test_a_pipeline_id_declared_by_two_tasks_is_refused_naming_both(topic_name):
    store = OffsetStoreHook().get_store()
    pipeline = f"own_{topic_name}"
    assert store.take_pipeline(pipeline, owner=Owner("dag_a", "store")) == 1
    with pytest.raises(PipelineConflictError,
                       match="belongs to DAG 'dag_a' task 'store', and DAG 'dag_b' task 'store' declares"):
        store.take_pipeline(pipeline, owner=Owner("dag_b", "store"))
    assert store.take_pipeline(pipeline, owner=Owner("dag_a", "store")) == 2  # the refused take fenced nobody
    with pytest.raises(PipelineConflictError, match="ran in continuous mode"):
        store.take_interval(pipeline, Interval(*hour(0)), owner=Owner("dag_a", "store"))
