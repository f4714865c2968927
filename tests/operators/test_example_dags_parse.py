"""Every DAG of ``dags/`` imports and parses (no services needed), and the alert examples are wired as the README
recipes say: the deadline on the pipeline's DAG, the deferrable lag sensor with its notifier."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from airflow_eo.operators.alerts import PipelineLagNotifier, pipeline_deadline_missed
from airflow_eo.sensors import KafkaBacklogSensor

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def bag() -> DagBag:
    return DagBag(dag_folder=str(DAGS))


def test_every_example_dag_parses(bag):
    assert bag.import_errors == {}
    files = {Path(dag.fileloc).name for dag in bag.dags.values()}
    assert files == {p.name for p in DAGS.glob("*.py")}, "a file of dags/ defines no DAG"
    assert {"page_views_delta", "page_views_iceberg", "page_view_events_pg", "page_views_lag_alert"} <= set(bag.dags)


def test_the_pipeline_dag_has_a_deadline_with_our_callback(bag):
    deadline = bag.dags["page_view_events_hourly"].deadline
    [alert] = deadline if isinstance(deadline, list) else [deadline]
    assert alert.interval == timedelta(minutes=30)
    assert type(alert.reference).__name__ == "DagRunQueuedAtDeadline"
    assert alert.callback.path == f"{pipeline_deadline_missed.__module__}.{pipeline_deadline_missed.__name__}"
    assert alert.callback.kwargs == {"pipeline_id": "page_view_events_hourly.page_views"}


def test_the_lag_alert_is_a_deferrable_sensor_that_notifies_when_it_fires(bag):
    [sensor] = bag.dags["page_views_lag_alert"].tasks
    assert isinstance(sensor, KafkaBacklogSensor)
    assert sensor.deferrable and sensor.soft_fail
    assert (sensor.threshold.min_records, sensor.threshold.min_age_seconds) == (100_000, 1800)
    assert sensor.timeout < timedelta(minutes=10).total_seconds()  # over before the next run
    assert [type(c) for c in sensor.on_success_callback] == [PipelineLagNotifier]


def test_the_event_driven_example_is_scheduled_on_the_pipelines_backlog(bag):
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_eo.triggers.events import EoBacklogTrigger

    dag = bag.dags["page_view_events_on_arrival"]
    [task] = dag.tasks
    assert dag.max_active_runs == 1 and task.mode.value == "continuous" and task.max_active_tis_per_dag == 1
    [asset] = dag.timetable.asset_condition.objects
    [watcher] = asset.watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == "airflow_eo.triggers.events.EoBacklogTrigger"
    assert (kwargs["pipeline_id"], kwargs["topics"]) == (task.pipeline_id, task.topics)
    assert (kwargs["min_records"], kwargs["max_delay"], kwargs["poll_interval"]) == (1000, 10.0, 1.0)
    assert isinstance(watcher.trigger, EoBacklogTrigger)
    DagSerialization.to_dict(dag)  # what the dag-processor stores, the watcher's trigger included
