"""The peers (at least once), as people write them today: Spark Structured Streaming with ``foreachBatch``,
Spark's JDBC writer into MariaDB and PostgreSQL, Spark's Kafka writer, Airflow's ``ConsumeFromTopicOperator``."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_eo.core.batch import BatchContext, WritePlan
from airflow_eo.core.ranges import spark_offsets
from airflow_eo.mysql.sink import MySqlUpsertAdapter
from airflow_eo.mysql.sql import upsert_statement
from bench.common import (
    EVENT_COLUMNS,
    ROWS_PER_STATEMENT,
    Job,
    engine,
    expect,
    fresh_pg_table,
    fresh_table,
    kafka_stream,
    mysql_kwargs,
    parsed_events,
    pg_kwargs,
    pg_table_rows,
    spark_hook,
    sql,
    table_rows,
    whole_topic,
)
from examples import ip_counts, page_views
from examples.topics import ensure_topic, read_topic


def structured_streaming_foreach_batch(topic: str, events: int, parallelism: int, workdir: Path) -> Job:
    """``readStream`` + ``availableNow`` + a checkpoint + ``foreachBatch`` upserting with our statements."""
    table = fresh_table("page_view_events", "ss")
    spark = spark_hook().get_conn()
    eng = engine(parallelism)
    # Our writer's multi-row statements (the peer as teams write it: no bulk load), without the offset store
    # (so without the epoch fence of our upsert sink).
    writer = MySqlUpsertAdapter(mysql_kwargs(), name="MySqlUpsertSink", table=table, key_columns=("event_id",),
                                updates={}, rows_per_statement=500, dead_letter_table="eo_dead_letter", bulk_load=False)
    writer.check()
    starting, _ = spark_offsets(whole_topic(topic))

    def upsert(df: Any, epoch_id: int) -> None:
        batch = BatchContext("bench_ss", epoch_id, "bench", 0, ())
        out = parsed_events(df)
        eng.run_partitions(WritePlan(out, eng), writer.partition_writer(batch, out.columns))

    started = time.monotonic()
    query = (kafka_stream(spark, topic, starting)
             .writeStream.foreachBatch(upsert)
             .option("checkpointLocation", str(workdir / f"checkpoint_{table}"))
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    seconds = time.monotonic() - started
    expect("rows in the table", table_rows(table), events)
    return Job("structured_streaming_foreach_batch", events, parallelism, seconds)


def spark_jdbc_append(topic: str, events: int, parallelism: int) -> Job:
    """Batch read of the same ranges, ``df.write.jdbc`` append (no upsert) with MariaDB Connector/J."""
    table = fresh_table("page_view_events", "jdbc")
    spark = spark_hook().get_conn()
    eng = engine(parallelism)
    connect = mysql_kwargs()
    started = time.monotonic()
    raw = eng.read(spark, BatchContext("bench_jdbc", 0, "bench", 0, whole_topic(topic)))
    out = parsed_events(raw.withColumnRenamed("kafka_value", "value")).repartition(parallelism)
    # The jdbc:mysql scheme makes Spark pick its MySQL dialect (backquoted names); permitMysqlScheme lets
    # Connector/J take it.
    url = f"jdbc:mysql://{connect['host']}:{connect['port']}/{connect['database']}?permitMysqlScheme"
    out.write.jdbc(url, table, "append",
                   {"user": connect["user"], "password": connect["password"], "driver": "org.mariadb.jdbc.Driver",
                    "batchsize": str(ROWS_PER_STATEMENT)})
    seconds = time.monotonic() - started
    expect("rows in the table", table_rows(table), events)
    return Job("spark_jdbc_append", events, parallelism, seconds)


def spark_jdbc_append_pg(topic: str, events: int, parallelism: int) -> Job:
    """The PostgreSQL sinks' peer: the same read, ``df.write.jdbc`` append (no upsert) with PostgreSQL's driver."""
    table = fresh_pg_table("page_view_events", "jdbcpg")
    spark = spark_hook().get_conn()
    eng = engine(parallelism)
    connect = pg_kwargs()
    started = time.monotonic()
    raw = eng.read(spark, BatchContext("bench_jdbc_pg", 0, "bench", 0, whole_topic(topic)))
    out = parsed_events(raw.withColumnRenamed("kafka_value", "value")).repartition(parallelism)
    # reWriteBatchedInserts: the driver sends each JDBC batch as multi-row INSERTs, as people tune it for bulk.
    out.write.jdbc(f"jdbc:postgresql://{connect['host']}:{connect['port']}/{connect['dbname']}", f'"{table}"',
                   "append", {"user": connect["user"], "password": connect["password"],
                              "driver": "org.postgresql.Driver", "batchsize": str(ROWS_PER_STATEMENT),
                              "reWriteBatchedInserts": "true"})
    seconds = time.monotonic() - started
    expect("rows in the table", pg_table_rows(table), events)
    return Job("spark_jdbc_append_pg", events, parallelism, seconds)


def spark_jdbc_append_counts(topic: str, events: int, parallelism: int) -> Job:
    """``eo_xa_counts``' peer: the same read and per-app counts (``page_views.count_per_app``), ``df.write.jdbc``
    append of the aggregated rows into a fresh ``app_pv`` (no accumulation across batches: at least once)."""
    table = fresh_table("app_pv", "jdbcc")
    spark = spark_hook().get_conn()
    eng = engine(parallelism)
    connect = mysql_kwargs()
    started = time.monotonic()
    batch = BatchContext("bench_jdbc_counts", 0, "bench", 0, whole_topic(topic))
    raw = eng.read(spark, batch)
    out = page_views.count_per_app(parsed_events(raw.withColumnRenamed("kafka_value", "value")), batch)
    url = f"jdbc:mysql://{connect['host']}:{connect['port']}/{connect['database']}?permitMysqlScheme"
    out.coalesce(parallelism).write.jdbc(
        url, table, "append", {"user": connect["user"], "password": connect["password"],
                               "driver": "org.mariadb.jdbc.Driver", "batchsize": str(ROWS_PER_STATEMENT)})
    seconds = time.monotonic() - started
    expect("page views counted", int(sql(f"SELECT SUM(pv) FROM `{table}`")[0][0]), events)
    return Job("spark_jdbc_append_counts", events, parallelism, seconds)


def spark_kafka_writer(lines_topic: str, events: int, parallelism: int) -> Job:
    """``eo_kafka_txn``'s peer: the same read and per-window counts (``ip_counts.count_per_window_and_ip``) written
    by Spark's own Kafka writer (``df.write.format("kafka")``: idempotent producers, no transactions)."""
    from pyspark.sql import functions as F

    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    out_topic = f"{lines_topic}_spark_out"
    ensure_topic(bootstrap, out_topic, 3)
    spark = spark_hook().get_conn()
    eng = engine(parallelism, schema=None)
    started = time.monotonic()
    batch = BatchContext("bench_spark_kafka", 0, "bench", 0, whole_topic(lines_topic))
    raw = eng.read(spark, batch)
    lines = raw.select(F.col("kafka_value").cast("string").alias("value"), "kafka_topic", "kafka_partition",
                       "kafka_offset")
    out = ip_counts.count_per_window_and_ip(lines, batch)
    out.coalesce(parallelism).write.format("kafka").option("kafka.bootstrap.servers", bootstrap) \
        .option("topic", out_topic).save()
    seconds = time.monotonic() - started
    counted = sum(json.loads(value or b"{}")["count"] for _, value in read_topic(bootstrap, out_topic)[0])
    expect("lines counted in the output topic", counted, events)
    return Job("spark_kafka_writer", events, parallelism, seconds)


def _upsert_messages(messages: list[Any], table: str) -> None:
    """``apply_function_batch`` of the Airflow peer: one multi-row upsert per poll's worth of messages."""
    import pymysql

    rows = []
    for message in messages:
        event = json.loads(message.value())
        rows.append((event["event_id"], event["app_id"], event["user_id"],
                     datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).replace(tzinfo=None)))
    conn = pymysql.connect(**mysql_kwargs(), autocommit=True)
    try:
        with conn.cursor() as cur:
            for at in range(0, len(rows), ROWS_PER_STATEMENT):
                chunk = rows[at:at + ROWS_PER_STATEMENT]
                cur.execute(upsert_statement(table, EVENT_COLUMNS, ["event_id"], {}, len(chunk), False),
                            [v for row in chunk for v in row])
    finally:
        conn.close()


def airflow_consume_from_topic(topic: str, events: int, parallelism: int) -> Job:
    """What an Airflow user reaches for first: ``ConsumeFromTopicOperator`` + ``apply_function_batch``."""
    from airflow.providers.apache.kafka.operators.consume import ConsumeFromTopicOperator

    table = fresh_table("page_view_events", "afk")
    conn_id = f"bench_consume_{uuid.uuid4().hex[:6]}"
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": os.environ["EO_KAFKA_BOOTSTRAP"], "group.id": conn_id,
        "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"}})
    operator = ConsumeFromTopicOperator(task_id="consume", topics=[topic], kafka_config_id=conn_id,
                                        apply_function_batch=_upsert_messages,
                                        apply_function_kwargs={"table": table}, max_messages=events,
                                        max_batch_size=4 * ROWS_PER_STATEMENT, poll_timeout=10,
                                        commit_cadence="end_of_batch")
    started = time.monotonic()
    operator.execute(context={})
    seconds = time.monotonic() - started
    expect("rows in the table", table_rows(table), events)
    return Job("airflow_consume_from_topic", events, parallelism, seconds,
               note="one consumer, one connection (the operator has no parallelism)")
