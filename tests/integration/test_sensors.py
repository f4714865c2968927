"""Backlog and batch-committed sensors and their triggers, against the real Kafka and store."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import timedelta

import pytest
from airflow.sdk.exceptions import TaskDeferred
from confluent_kafka import Producer

from airflow_eo.core.batch import BatchSummary
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.hooks.mysql import OffsetStoreHook
from airflow_eo.sensors import BatchCommittedSensor, KafkaBacklogSensor
from airflow_eo.triggers.pipeline import BatchCommittedTrigger, KafkaBacklogTrigger
from tests.support.kafka import create_topic


@pytest.fixture
def store():
    """The offset store the sensors read (connection ``eo_offset_store``)."""
    return OffsetStoreHook().get_store()


def commit(store, batch, epoch) -> None:
    """Commit ``batch`` in the store, as a run that processed it would (empty summary)."""
    store.commit_batch(batch, epoch, BatchSummary.of(batch, batch.run_id, epoch))


def produce(bootstrap: str, topic: str, n: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(topic, f"r{i}".encode(), partition=partition)
    producer.flush(30)


def test_poke_reports_the_lag_against_committed_offsets(bootstrap, store, topic_name):
    create_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic_name, 6, partition=0)
    produce(bootstrap, topic_name, 4, partition=1)
    pipeline = f"p_{topic_name}"
    sensor = KafkaBacklogSensor(task_id="wait", pipeline_id=pipeline, topics=topic_name, min_records=8)
    first = sensor.poke({})
    assert first.is_done and first.xcom_value == {"lag": {f"{topic_name}[0]": 6, f"{topic_name}[1]": 4}, "total": 10}

    epoch = store.take_pipeline(pipeline)
    batch = store.insert_batch(pipeline, epoch, "r1", [OffsetRange(topic_name, 0, 0, 5)], [])
    commit(store, batch, epoch)
    after = sensor.poke({})
    assert not after.is_done and after.xcom_value["total"] == 5
    per_partition = KafkaBacklogSensor(task_id="w2", pipeline_id=pipeline, topics=[topic_name], min_records=4,
                                       per_partition=True)
    assert per_partition.poke({}).is_done  # partition 1 alone has 4


def test_deferrable_sensor_defers_to_a_serializable_trigger_that_fires_on_new_records(bootstrap, topic_name):
    create_topic(bootstrap, topic_name, 1)
    sensor = KafkaBacklogSensor(task_id="wait", pipeline_id=f"p_{topic_name}", topics=[topic_name], min_records=3,
                                deferrable=True, poll_interval=0.5, timeout=120)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_eo.triggers.pipeline.KafkaBacklogTrigger"
    rebuilt = KafkaBacklogTrigger(**kwargs)  # what the triggerer does
    assert rebuilt.serialize() == (classpath, kwargs)

    threading.Timer(2.0, produce, (bootstrap, topic_name, 3)).start()
    started = time.monotonic()

    async def first_event():
        return await asyncio.wait_for(rebuilt.run().__anext__(), timeout=60)

    event = asyncio.run(first_event())
    assert event.payload["status"] == "ready" and event.payload["total"] == 3
    assert time.monotonic() - started >= 1.5  # it waited for the records
    assert sensor.execute_complete({}, event.payload) == {"lag": {f"{topic_name}[0]": 3}, "total": 3}


def test_batch_committed_sensor_and_trigger(store):
    pipeline = f"p_{uuid.uuid4().hex[:8]}"
    sensor = BatchCommittedSensor(task_id="wait", pipeline_id=pipeline, after_batch_id=0, deferrable=True,
                                  poll_interval=0.5)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = BatchCommittedTrigger(**deferred.value.trigger.serialize()[1])
    epoch = store.take_pipeline(pipeline)
    for run_id in ("r0", "r1"):
        batch = store.insert_batch(pipeline, epoch, run_id, [], [])
        commit(store, batch, epoch)
    event = asyncio.run(asyncio.wait_for(trigger.run().__anext__(), timeout=30))
    assert event.payload == {"status": "committed", "batch_id": 1}
    assert sensor.execute_complete({}, event.payload) == 1
    assert not BatchCommittedSensor(task_id="w", pipeline_id=pipeline, after_batch_id=1).poke({}).is_done


def test_batch_committed_sensor_waits_for_its_data_interval(store):
    from datetime import datetime, timedelta, timezone

    from airflow_eo.core.planning import Interval

    pipeline = f"p_{uuid.uuid4().hex[:8]}"
    start = datetime(2026, 11, 20, 5, tzinfo=timezone.utc)
    hours = [Interval(start + timedelta(hours=h), start + timedelta(hours=h + 1)) for h in (0, 1)]
    context = {"data_interval_start": hours[1].start, "data_interval_end": hours[1].end}
    sensor = BatchCommittedSensor(task_id="wait", pipeline_id=pipeline, for_data_interval=True, deferrable=True,
                                  poll_interval=0.5)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    assert deferred.value.trigger.interval == [hours[1].start.isoformat(), hours[1].end.isoformat()]
    assert not hasattr(sensor, "_interval")  # what the trigger needs comes from the context, not from poke
    trigger = BatchCommittedTrigger(**deferred.value.trigger.serialize()[1])
    batches = {}
    for interval in hours:
        epoch = store.take_interval(pipeline, interval)
        batches[interval] = (store.insert_batch(pipeline, epoch, "r", [], [], interval=interval), epoch)
    commit(store, *batches[hours[0]])  # another hour committed: not ours
    assert not sensor.poke(context).is_done
    commit(store, *batches[hours[1]])
    event = asyncio.run(asyncio.wait_for(trigger.run().__anext__(), timeout=30))
    assert event.payload == {"status": "committed", "batch_id": batches[hours[1]][0].batch_id}
    with pytest.raises(ConfigurationError, match="no data interval"):
        sensor.poke({})


def test_the_oldest_unprocessed_record_age_fires_a_lag_alert(bootstrap, store, topic_name):
    """A lag alert by age: records produced with Kafka timestamps two hours back, one partition processed."""
    create_topic(bootstrap, topic_name, 2)
    producer = Producer({"bootstrap.servers": bootstrap})
    two_hours_ago_ms = int(time.time() * 1000) - 2 * 3600 * 1000
    for i in range(3):
        producer.produce(topic_name, f"old{i}".encode(), partition=0, timestamp=two_hours_ago_ms + i)
        producer.produce(topic_name, f"new{i}".encode(), partition=1)  # stamped now
    producer.flush(30)
    pipeline = f"p_{topic_name}"
    alert = KafkaBacklogSensor(task_id="lag", pipeline_id=pipeline, topics=topic_name, min_records=None,
                               min_age=timedelta(hours=1))
    fired = alert.poke({})
    assert fired.is_done and fired.xcom_value["total"] == 6
    assert 2 * 3600 - 5 <= fired.xcom_value["oldest_age_seconds"] <= 2 * 3600 + 120

    # Partition 0 processed: the oldest unprocessed record is now one of partition 1's, seconds old.
    epoch = store.take_pipeline(pipeline)
    commit(store, store.insert_batch(pipeline, epoch, "r1", [OffsetRange(topic_name, 0, 0, 3)], []), epoch)
    quiet = alert.poke({})
    assert not quiet.is_done and quiet.xcom_value["total"] == 3 and quiet.xcom_value["oldest_age_seconds"] < 600

    # Deferred, the trigger waits the same way; 2 s of age, then it fires.
    soon = KafkaBacklogSensor(task_id="lag2", pipeline_id=pipeline, topics=[topic_name], min_records=None,
                              min_age=timedelta(seconds=quiet.xcom_value["oldest_age_seconds"] + 2),
                              deferrable=True, poll_interval=0.5, timeout=120)
    with pytest.raises(TaskDeferred) as deferred:
        soon.execute({})
    classpath, kwargs = deferred.value.trigger.serialize()
    event = asyncio.run(asyncio.wait_for(KafkaBacklogTrigger(**kwargs).run().__anext__(), timeout=60))
    assert event.payload["status"] == "ready" and event.payload["total"] == 3
    assert soon.execute_complete({}, event.payload)["oldest_age_seconds"] >= kwargs["min_age_seconds"]
