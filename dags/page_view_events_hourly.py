"""Each hour's page-view events in ``page_view_events_hourly``: interval mode through the upsert sink.

A run processes exactly the records of its data interval: from the first offset whose
Kafka timestamp is at or after the interval's start up to the first at or after its end
(``offsets_for_times``), so adjacent hours are contiguous and never overlap. Backfill past
hours from the UI (Trigger → Backfill) or ``airflow backfill create``; a cleared or
reprocessed hour replays its recorded ranges and rewrites the same rows. An hour whose
end the broker has not seen yet on every partition fails before any side effect and is
retried.

``params.topic`` (default ``page_views``) selects the topic; the pipeline id includes it,
so each topic keeps its own batch log.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, CronDataIntervalTimetable, Param, task

from airflow_eo.examples import page_views
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink

with DAG(
    dag_id="page_view_events_hourly",
    # A data-interval timetable: in Airflow 3 a plain "@hourly" gives runs a zero-length interval.
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=3,
    params={"topic": Param(page_views.TOPIC, type="string", description="Kafka topic of the page views")},
    tags=["airflow_eo", "example"],
    doc_md=__doc__,
):

    @task
    def create_table() -> None:
        page_views.ensure_tables(EoMySqlHook("mysql_default").get_connect_kwargs())

    store_hour = KafkaMicroBatchOperator(
        task_id="store_hour",
        mode="interval",
        pipeline_id="page_view_events_hourly.{{ params.topic }}",
        topics=["{{ params.topic }}"],
        value_format="json",
        schema=page_views.SCHEMA,
        sink=MySqlUpsertSink(table="page_view_events_hourly", key_columns=["event_id"]),
        retries=3,
        retry_delay=timedelta(seconds=30),
    )

    create_table() >> store_hour
