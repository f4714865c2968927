"""The sensors and triggers follow Airflow's provider conventions (no stack needed).

``deferrable`` defaults to ``[operators] default_deferrable``; triggers round-trip through
``serialize()`` and poll the hooks that own the queries; a sensor passes nothing from
``poke`` to its trigger through instance attributes.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import OffsetStoreHook
from airflow_eo.sensors import BatchCommittedSensor, KafkaBacklogSensor
from airflow_eo.triggers.pipeline import BatchCommittedTrigger, KafkaBacklogTrigger

START, END = datetime(2026, 11, 20, 5, tzinfo=timezone.utc), datetime(2026, 11, 20, 6, tzinfo=timezone.utc)
CONTEXT = {"data_interval_start": START, "data_interval_end": END}

# The default of ``deferrable`` is evaluated when the sensor classes are defined (import time),
# so each setting of [operators] default_deferrable is tested in a fresh interpreter.
DEFERRABLE_PROBE = """
import json
from airflow_eo.sensors import BatchCommittedSensor, KafkaBacklogSensor
print(json.dumps({
    "backlog": KafkaBacklogSensor(task_id="b", pipeline_id="p", topics="t").deferrable,
    "committed": BatchCommittedSensor(task_id="c", pipeline_id="p").deferrable,
    "explicit": BatchCommittedSensor(task_id="e", pipeline_id="p", deferrable=False).deferrable,
}))
"""


@pytest.mark.parametrize("setting, expected", [("true", True), ("false", False), (None, False)])
def test_deferrable_defaults_to_operators_default_deferrable(setting, expected):
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"}
    if setting is not None:
        env["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] = setting
    done = subprocess.run([sys.executable, "-c", DEFERRABLE_PROBE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"backlog": expected, "committed": expected, "explicit": False}


def roundtrip(trigger):
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # plain values only: no hook, no datetime
    module, name = classpath.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)  # what the triggerer does
    assert type(rebuilt) is type(trigger) and rebuilt.serialize() == (classpath, kwargs)
    return rebuilt


def test_triggers_round_trip_through_serialize_and_hold_their_hooks(monkeypatch):
    backlog = roundtrip(KafkaBacklogTrigger("p", ["a", "b"], min_records=5, per_partition=True,
                                            starting_offsets="latest", kafka_conn_id="k", offset_store_conn_id="s",
                                            poll_interval=2.5))
    assert backlog.serialize()[0] == "airflow_eo.triggers.pipeline.KafkaBacklogTrigger"
    assert isinstance(backlog.kafka_hook, KafkaClusterHook) and backlog.kafka_hook.kafka_config_id == "k"
    assert isinstance(backlog.store_hook, OffsetStoreHook) and backlog.store_hook.offset_store_conn_id == "s"

    # A hook makes its offset source (an admin client) once, as the provider's get_conn is made once: a trigger's
    # polls, and a run's planning, metrics and group mirror, share it.
    monkeypatch.setenv("AIRFLOW_CONN_K", json.dumps({"conn_type": "kafka",
                                                     "extra": {"bootstrap.servers": "127.0.0.1:1"}}))
    source = backlog.kafka_hook.get_offset_source()
    assert backlog.kafka_hook.get_offset_source() is source
    assert KafkaClusterHook("k").get_offset_source() is not source  # each hook its own

    committed = roundtrip(BatchCommittedTrigger("p", 7, "s", 1.0, [START.isoformat(), END.isoformat()]))
    assert committed.serialize()[0] == "airflow_eo.triggers.pipeline.BatchCommittedTrigger"
    assert committed.interval == [START.isoformat(), END.isoformat()]
    assert isinstance(committed.hook, OffsetStoreHook) and committed.hook.offset_store_conn_id == "s"
    assert roundtrip(BatchCommittedTrigger("p")).interval is None


def test_batch_committed_sensor_builds_its_trigger_from_the_context(monkeypatch):
    calls = []

    def committed_batch_id(hook, pipeline_id, after_batch_id=-1, interval=None):
        calls.append((hook.offset_store_conn_id, pipeline_id, after_batch_id, interval))
        return None

    monkeypatch.setattr(OffsetStoreHook, "committed_batch_id", committed_batch_id)
    sensor = BatchCommittedSensor(task_id="w", pipeline_id="p", for_data_interval=True, offset_store_conn_id="s",
                                  deferrable=True, poll_interval=0.5)
    assert not hasattr(sensor, "_interval")
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(CONTEXT)
    assert calls == [("s", "p", -1, [START.isoformat(), END.isoformat()])]  # poke asked the hook
    assert not hasattr(sensor, "_interval")
    trigger = deferred.value.trigger
    assert isinstance(trigger, BatchCommittedTrigger) and trigger.interval == [START.isoformat(), END.isoformat()]
    # the trigger is a function of the operator and the context alone: no poke needed before it
    fresh = BatchCommittedSensor(task_id="w", pipeline_id="p", for_data_interval=True, offset_store_conn_id="s",
                                 poll_interval=0.5)
    assert fresh.build_trigger(CONTEXT).serialize() == trigger.serialize()


def test_triggers_poll_their_hooks(monkeypatch):
    found = iter([None, None, 3])
    monkeypatch.setattr(OffsetStoreHook, "committed_batch_id", lambda hook, p, after, interval: next(found))
    event = asyncio.run(asyncio.wait_for(BatchCommittedTrigger("p", 1, poll_interval=0.01).run().__anext__(), 10))
    assert event.payload == {"status": "committed", "batch_id": 3}

    lags = iter([{"t[0]": 1}, {"t[0]": 4}])
    committed = {("t", 0): 2}
    monkeypatch.setattr(OffsetStoreHook, "committed_offsets", lambda hook, p: committed)

    def backlog(hook, topics, given, starting_offsets):
        assert topics == ["t"] and given is committed and starting_offsets == "earliest"
        return next(lags)

    monkeypatch.setattr(KafkaClusterHook, "backlog", backlog)
    trigger = KafkaBacklogTrigger("p", ["t"], min_records=3, poll_interval=0.01)
    event = asyncio.run(asyncio.wait_for(trigger.run().__anext__(), 10))
    assert event.payload == {"status": "ready", "lag": {"t[0]": 4}, "total": 4}
    sensor = KafkaBacklogSensor(task_id="b", pipeline_id="p", topics="t", min_records=3)
    lags = iter([{"t[0]": 2}])
    assert sensor.poke({}).xcom_value == {"lag": {"t[0]": 2}, "total": 2}


def test_the_event_trigger_round_trips_holds_its_hooks_and_refuses_bad_settings():
    from datetime import timedelta

    from airflow.triggers.base import BaseEventTrigger

    from airflow_eo.core.errors import ConfigurationError
    from airflow_eo.triggers.events import EoBacklogTrigger

    trigger = roundtrip(EoBacklogTrigger("p", ["b", "a"], min_records=None, max_delay=timedelta(seconds=30),
                                         min_interval=timedelta(minutes=2), starting_offsets="latest",
                                         kafka_conn_id="k", offset_store_conn_id="s", poll_interval=1.5))
    assert isinstance(trigger, BaseEventTrigger)  # what an AssetWatcher accepts
    assert trigger.serialize()[1] == {"pipeline_id": "p", "topics": ["b", "a"], "min_records": None,
                                      "max_delay": 30.0, "min_interval": 120.0, "starting_offsets": "latest",
                                      "kafka_conn_id": "k", "offset_store_conn_id": "s", "poll_interval": 1.5}
    assert BaseEventTrigger.hash(*trigger.serialize()) == BaseEventTrigger.hash(*roundtrip(trigger).serialize())
    assert trigger.kafka_hook.kafka_config_id == "k" and trigger.store_hook.offset_store_conn_id == "s"
    same_poll = EoBacklogTrigger("p", ["a", "b"], min_records=7, max_delay=5, starting_offsets="latest",
                                 kafka_conn_id="k", offset_store_conn_id="s", poll_interval=1.5)
    assert same_poll.shared_stream_key() == trigger.shared_stream_key()
    assert EoBacklogTrigger("p", "a", kafka_conn_id="k").shared_stream_key() != trigger.shared_stream_key()
    for bad in ({"min_records": 0}, {"min_records": None}, {"max_delay": 0}, {"min_interval": timedelta(0)},
                {"poll_interval": -1}, {"topics": []}, {"pipeline_id": "no spaces"}):
        with pytest.raises(ConfigurationError):
            EoBacklogTrigger(**{"pipeline_id": "p", "topics": ["t"], **bad})
