"""Cumulative page views per app, exactly once: topic ``page_views`` → ``app_pv`` through the XA sink.

Each run reads the records that arrived since the last committed batch, counts them per
app, and adds the counts (``pv = pv + new.pv``) inside XA branches that commit only
after the offset store's commit point.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_eo.examples import page_views
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlXaSink

with DAG(
    dag_id="page_views_xa",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # continuous mode: one batch at a time per pipeline
    tags=["airflow_eo", "example"],
    doc_md=__doc__,
    # Where Spark runs: "" = local[*] in the task; a run's conf may name a spark / spark_connect connection.
    params={"spark_conn_id": Param("", type="string", description="spark or spark_connect connection id")},
):

    @task
    def create_table() -> None:
        page_views.ensure_tables(EoMySqlHook("mysql_default").get_connect_kwargs())

    count_page_views = KafkaMicroBatchOperator(
        task_id="count_page_views",
        pipeline_id="page_views_xa",
        topics=[page_views.TOPIC],
        value_format="json",
        schema=page_views.SCHEMA,
        transform=page_views.count_per_app,
        sink=MySqlXaSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"}),
        kafka_conn_id="kafka_default",
        offset_store_conn_id="eo_offset_store",
        spark_conn_id="{{ params.spark_conn_id }}",
        retries=2,
        retry_delay=timedelta(seconds=10),
    )

    create_table() >> count_page_views
