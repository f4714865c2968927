"""Every page-view event once in a lakehouse table: topic ``page_views`` → a Delta Lake table (DAG
``page_views_delta``) and an Apache Iceberg table (DAG ``page_views_iceberg``), appended batch by batch.

The table's own commit is each batch's commit point (Delta's ``txnAppId``/``txnVersion``, an Iceberg snapshot naming
the batch), so an append is exactly once: a batch the table already has is never written again. The tables live
under the folder ``$AIRFLOW_EO_LAKEHOUSE`` (default ``/tmp/airflow_eo/lakehouse``; a Hadoop file system URI such as
``s3a://lake`` works too, with its credentials in ``spark.hadoop.*``): ``<lakehouse>/delta/page_view_events``, and
the Hadoop catalog ``lake`` at ``<lakehouse>/iceberg`` with the table ``lake.events.page_view_events``. Two DAGs,
not two tasks of one: each table format adds its package and SQL extension to the Spark session, which a task's
process starts once. A ``MERGE`` (``key_columns``, ``updates``) is one argument away: docs/how-to/delta.md,
docs/how-to/iceberg.md.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_eo.examples import page_views
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import DeltaTableSink, IcebergTableSink

LAKEHOUSE = os.environ.get("AIRFLOW_EO_LAKEHOUSE", "/tmp/airflow_eo/lakehouse").rstrip("/")

SINKS = {
    "page_views_delta": DeltaTableSink(path=f"{LAKEHOUSE}/delta/page_view_events"),
    "page_views_iceberg": IcebergTableSink(table="lake.events.page_view_events", warehouse=f"{LAKEHOUSE}/iceberg"),
}

for dag_id, sink in SINKS.items():
    with DAG(
        dag_id=dag_id,
        schedule=timedelta(minutes=5),
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,  # continuous mode: one batch at a time per pipeline
        tags=["airflow_eo", "example", "lakehouse"],
        doc_md=__doc__,
        # Where Spark runs: "" = local[*] in the task; a spark connection (a cluster) or a spark_connect one (its
        # server started with the table format's jars and SQL extension: docs/how-to/delta.md).
        params={"spark_conn_id": Param("", type="string", description="spark connection id")},
    ):
        KafkaMicroBatchOperator(
            task_id="store_page_view_events",
            pipeline_id=dag_id,
            topics=[page_views.TOPIC],
            value_format="json",
            schema=page_views.SCHEMA,
            sink=sink,
            kafka_conn_id="kafka_default",
            offset_store_conn_id="eo_offset_store",
            spark_conn_id="{{ params.spark_conn_id }}",
            retries=2,
            retry_delay=timedelta(seconds=10),
        )
