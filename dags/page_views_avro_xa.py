"""Cumulative page views per app from a topic of Confluent-framed Avro: ``page_views_avro`` → ``app_pv_avro`` (XA).

The producers wrote two versions of the record (schema ids 1 and 2); each record is decoded with its own writer
schema and resolved into the reader schema, in Spark's JVM. A run's conf may name another topic.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_eo.examples import page_views
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlXaSink

with DAG(
    dag_id="page_views_avro_xa",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example"],
    doc_md=__doc__,
    params={"spark_conn_id": Param("", type="string", description="spark or spark_connect connection id"),
            "topic": Param(page_views.AVRO_TOPIC, type="string", description="the Avro topic to read")},
):

    @task
    def create_table() -> None:
        page_views.ensure_tables(EoMySqlHook("mysql_default").get_connect_kwargs())

    count_page_views = KafkaMicroBatchOperator(
        task_id="count_page_views",
        pipeline_id="page_views_avro_xa",
        topics=["{{ params.topic }}"],
        value_format="avro",
        avro_schema=json.dumps(page_views.AVRO_SCHEMA),
        framing="confluent",
        writer_schemas=page_views.AVRO_WRITER_SCHEMAS,
        transform=page_views.count_per_app,
        sink=MySqlXaSink(table="app_pv_avro", key_columns=["app_id"], updates={"pv": "add"}),
        spark_conn_id="{{ params.spark_conn_id }}",
        retries=2,
        retry_delay=timedelta(seconds=10),
    )

    create_table() >> count_page_views
