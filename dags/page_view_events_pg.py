"""Every page-view event once in ``page_view_events`` on PostgreSQL: topic ``page_views`` through the upsert sink,
the offset store in the same database.

A replayed batch rewrites the same rows (``INSERT .. ON CONFLICT DO UPDATE`` with overwrite semantics), and each
statement is fenced by the pipeline's epoch in the store's database, so output and offsets agree after any crash.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_eo.examples import page_views
from airflow_eo.hooks.postgres import EoPostgresHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import PostgresUpsertSink

with DAG(
    dag_id="page_view_events_pg",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example", "postgres"],
    doc_md=__doc__,
    # Where Spark runs: "" = local[*] in the task; a run's conf may name a spark / spark_connect connection.
    params={"spark_conn_id": Param("", type="string", description="spark or spark_connect connection id")},
):

    @task
    def create_table() -> None:
        page_views.ensure_postgres_tables(EoPostgresHook("postgres_default").get_connect_kwargs())

    store_page_view_events = KafkaMicroBatchOperator(
        task_id="store_page_view_events",
        pipeline_id="page_view_events_pg",
        topics=[page_views.TOPIC],
        value_format="json",
        schema=page_views.SCHEMA,
        sink=PostgresUpsertSink(table="page_view_events", key_columns=["event_id"], conn_id="postgres_default"),
        kafka_conn_id="kafka_default",
        offset_store_conn_id="postgres_default",
        spark_conn_id="{{ params.spark_conn_id }}",
        retries=2,
        retry_delay=timedelta(seconds=10),
    )

    create_table() >> store_page_view_events
