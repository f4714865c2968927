"""Cumulative page views per app, exactly once, all on PostgreSQL: topic ``page_views`` → ``app_pv`` through the
two-phase sink, with the offset store in the same database.

Each run reads the records that arrived since the last committed batch, counts them per app, and adds the counts
(``pv = pv + EXCLUDED.pv``) inside one transaction per Spark task that ends with ``PREPARE TRANSACTION``;
``COMMIT PREPARED`` follows the offset store's commit point. The server needs ``max_prepared_transactions`` > 0.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_eo.examples import page_views
from airflow_eo.hooks.postgres import EoPostgresHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import PostgresTwoPhaseSink

with DAG(
    dag_id="page_views_pg",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # continuous mode: one batch at a time per pipeline
    tags=["airflow_eo", "example", "postgres"],
    doc_md=__doc__,
    # Where Spark runs: "" = local[*] in the task; a run's conf may name a spark / spark_connect connection.
    params={"spark_conn_id": Param("", type="string", description="spark or spark_connect connection id")},
):

    @task
    def create_table() -> None:
        page_views.ensure_postgres_tables(EoPostgresHook("postgres_default").get_connect_kwargs())

    count_page_views = KafkaMicroBatchOperator(
        task_id="count_page_views",
        pipeline_id="page_views_pg",
        topics=[page_views.TOPIC],
        value_format="json",
        schema=page_views.SCHEMA,
        transform=page_views.count_per_app,
        sink=PostgresTwoPhaseSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"},
                                  conn_id="postgres_default"),
        kafka_conn_id="kafka_default",
        offset_store_conn_id="postgres_default",  # a postgres connection: the offset store on PostgreSQL
        spark_conn_id="{{ params.spark_conn_id }}",
        retries=2,
        retry_delay=timedelta(seconds=10),
    )

    create_table() >> count_page_views
