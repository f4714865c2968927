"""A lag alert on a pipeline, the Airflow 3 way: every 10 minutes a deferrable ``KafkaBacklogSensor`` waits in the
triggerer (no worker slot held) until 100,000 records of pipeline ``page_views_xa`` wait, or its oldest unprocessed
record is 30 minutes old. When it fires, its ``on_success_callback`` notifiers run: ``PipelineLagNotifier`` logs at
error level how far behind the pipeline is and counts ``airflow_eo.lag_alert``; add Airflow's notifiers that page
(``SlackNotifier``, ``SmtpNotifier``, ...) to the list. While the pipeline keeps up, the sensor times out before
the next run and is skipped (``soft_fail``): nothing fires.

A run's conf may point it at another pipeline and topic (``pipeline_id``, ``topic``). A deadline on a pipeline's own
DAG, the other alert, is in ``dags/page_view_events_hourly.py``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_eo.examples import page_views
from airflow_eo.operators.alerts import PipelineLagNotifier
from airflow_eo.sensors import KafkaBacklogSensor

with DAG(
    dag_id="page_views_lag_alert",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example", "alerts"],
    doc_md=__doc__,
    params={"pipeline_id": Param("page_views_xa", type="string", description="the pipeline to watch"),
            "topic": Param(page_views.TOPIC, type="string", description="its topic")},
):
    KafkaBacklogSensor(
        task_id="lag_over_threshold",
        pipeline_id="{{ params.pipeline_id }}",
        topics="{{ params.topic }}",
        min_records=100_000,
        min_age=timedelta(minutes=30),
        deferrable=True,
        poll_interval=30,
        timeout=timedelta(minutes=9).total_seconds(),  # over before the next run starts
        soft_fail=True,  # under the threshold for the whole run: skipped, not failed
        retries=2,  # a deferral Airflow 3.3 takes for a failure (docs/how-to/sensors.md) is retried
        retry_delay=timedelta(seconds=10),
        on_success_callback=[PipelineLagNotifier()],
        kafka_conn_id="kafka_default",
        offset_store_conn_id="eo_offset_store",
    )
