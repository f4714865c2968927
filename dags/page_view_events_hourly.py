"""Each hour's page-view events in ``page_view_events_hourly``: interval mode through the upsert sink.

A run processes exactly the records of its data interval: from the first offset whose
Kafka timestamp is at or after the interval's start up to the first at or after its end
(``offsets_for_times``), so adjacent hours are contiguous and never overlap. Backfill past
hours from the UI (Trigger → Backfill) or ``airflow backfill create``; a cleared or
reprocessed hour replays its recorded ranges and rewrites the same rows. An hour whose
end the broker has not seen yet on every partition fails before any side effect and is
retried. Backfilling hours 3 at a time (``max_active_runs=3``)? Declare the sink's Asset as
``store_hour``'s outlet, with your connection's address (docs/how-to/lineage.md): Airflow 3.3 can
otherwise fail one of two runs whose batches commit at the same moment.

``params.topic`` (default ``page_views``) selects the topic; the pipeline id includes it,
so each topic keeps its own batch log.

A deadline alert: an hour's run not done 30 minutes after it was queued makes the triggerer run
``pipeline_deadline_missed``, which logs where the pipeline (of the default topic) stands: last committed batch,
lag, unfinished batch, in-doubt branches. Airflow 3.3.1-3.3.2's ``airflow dags test`` exits non-zero after a
successful run of a DAG with a deadline (apache/airflow#73428); the scheduler is not affected. The lag alert is
``dags/page_views_lag_alert.py``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# AsyncCallback, DeadlineAlert and DeadlineReference are missing from 3.3.2's airflow/sdk/__init__.pyi, not the module.
from airflow.sdk import (  # type: ignore[attr-defined]
    DAG,
    AsyncCallback,
    CronDataIntervalTimetable,
    DeadlineAlert,
    DeadlineReference,
    Param,
    task,
)

from airflow_eo.examples import page_views
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.operators.alerts import pipeline_deadline_missed
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
    deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(minutes=30),
        callback=AsyncCallback(pipeline_deadline_missed,
                               kwargs={"pipeline_id": f"page_view_events_hourly.{page_views.TOPIC}"})),
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
