"""Change data capture, exactly once: PostgreSQL's ``public.customers``, streamed by a real Debezium (topic
``cdc.public.customers``), replicated into ``customers`` on MySQL / MariaDB (DAG ``customers_cdc``) and into a Delta
Lake table (DAG ``customers_cdc_delta``, at ``$AIRFLOW_EO_LAKEHOUSE/delta/customers``, default
``/tmp/airflow_eo/lakehouse``).

Each change event applies only when its source position (PostgreSQL's commit order) is newer than the position of
the change that last wrote the row, kept in ``eo_change_positions`` next to the table and committed with it; deletes
leave a marker there. So a connector that restarts and re-sends, a re-snapshot or a replayed batch never rolls a row
back, and after every committed batch the target equals the source as of a source position. Into Delta, the position
is a column of the table (``_eo_change_position``, added by the sink) written by the batch's own table commit, and
the delete markers a Delta table beside it (``customers_eo_delete_markers``).
``scripts/cdc_workload.py`` registers the connector (``make connect`` runs the Connect worker) and changes the source.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_eo.examples import customers
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import DeltaTableSink, MySqlUpsertSink

LAKEHOUSE = os.environ.get("AIRFLOW_EO_LAKEHOUSE", "/tmp/airflow_eo/lakehouse").rstrip("/")

with DAG(
    dag_id="customers_cdc",
    schedule=timedelta(minutes=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example", "cdc"],
    doc_md=__doc__,
):

    @task
    def create_target() -> None:
        customers.ensure_target(EoMySqlHook("mysql_default").get_connect_kwargs())

    replicate_customers = KafkaMicroBatchOperator(
        task_id="replicate_customers",
        pipeline_id="customers_cdc",
        topics=[customers.TOPIC],
        changes="debezium",
        schema=customers.SCHEMA,
        sink=MySqlUpsertSink(table="customers", key_columns=["id"], conn_id="mysql_default"),
        on_bad_record="dead_letter",
        kafka_conn_id="kafka_default",
        offset_store_conn_id="eo_offset_store",
        retries=2,
        retry_delay=timedelta(seconds=10),
    )

    create_target() >> replicate_customers

# Into Delta: a DAG of its own (a table format adds its package and SQL extension to the Spark session, which a
# task's process starts once). The sink creates the table from the source's columns on the first batch.
with DAG(
    dag_id="customers_cdc_delta",
    schedule=timedelta(minutes=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example", "cdc", "lakehouse"],
    doc_md=__doc__,
):
    KafkaMicroBatchOperator(
        task_id="replicate_customers",
        pipeline_id="customers_cdc_delta",
        topics=[customers.TOPIC],
        changes="debezium",
        schema=customers.SCHEMA,
        sink=DeltaTableSink(path=f"{LAKEHOUSE}/delta/customers", key_columns=["id"]),
        kafka_conn_id="kafka_default",
        offset_store_conn_id="eo_offset_store",
        retries=2,
        retry_delay=timedelta(seconds=10),
    )
