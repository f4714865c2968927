"""Reusing the operator: a factory function makes one DAG per region, and one DAG maps the operator over regions.

Every pipeline reads its own topic ``page_views_<region>`` and writes
``page_view_events_regional`` through the upsert sink. Each DAG, and each mapped task
instance, is its own pipeline (own pipeline id, offsets and batch log) in the same offset
store, so they run at the same time without interfering. Declaring one pipeline id in two
DAGs is refused at the first run of the second, with a message naming both.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_eo.examples import page_views
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink

REGIONS = ("eu", "us")
TABLE = "page_view_events_regional"
SINK = MySqlUpsertSink(table=TABLE, key_columns=["event_id"])


@task
def create_table() -> None:
    page_views.create_table_like(EoMySqlHook("mysql_default").get_connect_kwargs(), "page_view_events", TABLE)


def page_view_events_dag(region: str) -> DAG:
    """Pattern 1, a factory: one DAG per region; the pipeline id names the region."""
    with DAG(
        dag_id=f"page_view_events_{region}",
        schedule=timedelta(minutes=5),
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,  # continuous mode: one batch at a time per pipeline
        tags=["airflow_eo", "example", "reuse"],
        doc_md=__doc__,
    ) as dag:
        create_table() >> KafkaMicroBatchOperator(
            task_id="store_events",
            pipeline_id=f"page_view_events_{region}",
            topics=[f"page_views_{region}"],
            schema=page_views.SCHEMA,
            sink=SINK,
            retries=2,
            retry_delay=timedelta(seconds=10),
        )
    return dag


for region in REGIONS:
    page_view_events_dag(region)


with DAG(
    dag_id="page_view_events_mapped",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example", "reuse"],
    doc_md=__doc__,
):
    # Pattern 2, dynamic task mapping: one mapped instance per topic list. Without an explicit
    # pipeline_id each instance's id is "<dag_id>.<task_id>.<topics>", stable however the list is ordered.
    create_table() >> KafkaMicroBatchOperator.partial(
        task_id="store_events",
        schema=page_views.SCHEMA,
        sink=SINK,
        retries=2,
        retry_delay=timedelta(seconds=10),
    ).expand(topics=[[f"page_views_{region}"] for region in REGIONS])
