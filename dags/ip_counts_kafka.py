"""Requests per IP in 5-second windows, exactly once from Kafka to Kafka.

Reads ``ip_count_source`` lines ``"yyyy-MM-dd_HH:mm:ss <ip>"``, counts per (window, ip) and
appends the counts to ``ip_count_sink`` in one Kafka transaction that also commits the
consumed offsets. Read the output with ``isolation.level=read_committed``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from airflow_eo.examples import ip_counts
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import KafkaTransactionalSink

with DAG(
    dag_id="ip_counts_kafka",
    schedule=timedelta(minutes=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example"],
    doc_md=__doc__,
    # Where Spark runs: "" = local[*] in the task; a run's conf may name a spark / spark_connect connection.
    params={"spark_conn_id": Param("", type="string", description="spark or spark_connect connection id")},
):

    @task
    def create_topics() -> None:
        ip_counts.ensure_topics(KafkaClusterHook("kafka_default").get_config()["bootstrap.servers"])

    count_ips = KafkaMicroBatchOperator(
        task_id="count_ips",
        pipeline_id="ip_counts_kafka",
        topics=[ip_counts.SOURCE],
        value_format="string",
        transform=ip_counts.count_per_window_and_ip,
        sink=KafkaTransactionalSink(topic=ip_counts.SINK),
        spark_conn_id="{{ params.spark_conn_id }}",
        retries=2,
        retry_delay=timedelta(seconds=10),
    )

    create_topics() >> count_ips
