"""The Delta Lake and Iceberg jobs, in a child process of the point per format (Spark takes a format's jars,
SQL extension and catalog only when a session starts): the peers' appends and streams, and our sinks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.ranges import spark_offsets
from airflow_eo.sinks import DeltaTableSink, IcebergTableSink
from bench.common import (
    EVENT_COLUMNS,
    SCRIPT,
    SETTINGS,
    DriverMemory,
    Job,
    engine,
    expect,
    kafka_stream,
    parsed_events,
    spark_hook,
    whole_topic,
)
from bench.limits import r_kafka, warm_python_workers
from bench.ours import ours
from bench.report import print_job
from examples import page_views


def lakehouse_elsewhere(fmt: str, topic: str, events: int, parallelism: int, workdir: Path,
                        names: Sequence[str]) -> list[Job]:
    """The ``fmt`` jobs (``delta``, ``iceberg``) ``names`` in a child process: Spark takes a format's SQL extension
    and catalog only when a session starts, and the point's session started without them (its other jobs run as they
    always did)."""
    done = subprocess.run([sys.executable, str(SCRIPT), f"--{fmt}",
                           f"{topic}:{events}:{parallelism}:{','.join(names)}:{workdir}",
                           *(["--spark-conn", SETTINGS.spark_conn_id] if SETTINGS.spark_conn_id else [])],
                          stdout=subprocess.PIPE, text=True)
    lines = done.stdout.splitlines()
    print("\n".join(line for line in lines if line.startswith("  ")), flush=True)
    tag = f"{fmt.upper()} "
    if done.returncode != 0 or not any(line.startswith(tag) for line in lines):
        raise RuntimeError(f"the {fmt} jobs failed (exit {done.returncode}): {done.stdout[-2000:]}")
    return [Job(**job) for job in json.loads(next(line for line in lines if line.startswith(tag))[len(tag):])]


def delta_point(topic: str, events: int, parallelism: int, workdir: Path, names: Sequence[str]) -> list[Job]:
    """The Delta jobs in this process, its session started with the Delta sink's conf (jars, extension, catalog)."""
    return lakehouse_point(DeltaTableSink(path=str(workdir)).spark_conf(), {
        "spark_delta_append": lambda t, n: spark_delta_append(t, n, parallelism, workdir),
        "structured_streaming_delta": lambda t, n: structured_streaming_delta(t, n, parallelism, workdir),
        "eo_delta_append": lambda t, n: eo_delta(t, n, parallelism, workdir),
        "eo_delta_merge": lambda t, n: eo_delta(t, n, parallelism, workdir, merge=True),
    }, topic, events, parallelism, names)


def iceberg_point(topic: str, events: int, parallelism: int, workdir: Path, names: Sequence[str]) -> list[Job]:
    """The Iceberg jobs in this process, its session started with the Iceberg sink's conf (runtime jar, extension,
    the catalog ``bench`` of Hadoop tables under ``workdir``)."""
    return lakehouse_point(IcebergTableSink(table=f"{ICEBERG_CATALOG}.b.t", warehouse=str(workdir)).spark_conf(), {
        "spark_iceberg_append": lambda t, n: spark_iceberg_append(t, n, parallelism, workdir),
        "structured_streaming_iceberg": lambda t, n: structured_streaming_iceberg(t, n, parallelism, workdir),
        "eo_iceberg_append": lambda t, n: eo_iceberg(t, n, parallelism, workdir),
        "eo_iceberg_merge": lambda t, n: eo_iceberg(t, n, parallelism, workdir, merge=True),
    }, topic, events, parallelism, names)


def lakehouse_point(conf: dict[str, str], runs: dict[str, Callable[[str, int], Job]], topic: str, events: int,
                    parallelism: int, names: Sequence[str]) -> list[Job]:
    """A format's jobs in this process, its session started with ``conf``. As in the point's process, the JVM's
    start and a first run of each job on other events are not timed."""
    spark = spark_hook(conf).get_conn()
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    warm, warm_events = f"bench_warm_lake_{uuid.uuid4().hex[:8]}", min(events, 20_000)
    page_views.produce_page_views(os.environ["EO_KAFKA_BOOTSTRAP"], warm_events, topic=warm)
    r_kafka(warm, warm_events, parallelism)
    warm_python_workers(spark, parallelism)
    for name in names:  # the format's classes load and its plans compile in the first write of each kind
        runs[name](warm, warm_events)
    memory, jobs = DriverMemory(jvm_pid), []
    for name in names:
        memory.reset()
        job = runs[name](topic, events)
        job.driver_peak_rss_mb = memory.peak_mb()
        print_job(job)
        jobs.append(job)
    return jobs


def delta_rows(path: Path) -> int:
    """The rows of the Delta table at ``path``, as delta-rs reads its log and files (nothing of Spark's)."""
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_dataset().count_rows()


def spark_delta_append(topic: str, events: int, parallelism: int, workdir: Path) -> Job:
    """Batch read of the same ranges, the same parsed events, ``df.write.format("delta").mode("append")``."""
    path = workdir / f"delta_spark_{uuid.uuid4().hex[:6]}"
    spark = spark_hook().get_conn()
    eng = engine(parallelism)
    started = time.monotonic()
    raw = eng.read(spark, BatchContext("bench_delta", 0, "bench", 0, whole_topic(topic)))
    parsed_events(raw.withColumnRenamed("kafka_value", "value")).write.format("delta").mode("append").save(str(path))
    seconds = time.monotonic() - started
    expect("rows in the Delta table", delta_rows(path), events)
    return Job("spark_delta_append", events, parallelism, seconds)


def structured_streaming_delta(topic: str, events: int, parallelism: int, workdir: Path) -> Job:
    """``readStream`` + ``availableNow`` + a checkpoint into Delta's own streaming sink
    (``writeStream.format("delta")``: what the Delta docs show; no ``foreachBatch``, which a plain append does not
    need)."""
    path = workdir / f"delta_ss_{uuid.uuid4().hex[:6]}"
    spark = spark_hook().get_conn()
    starting, _ = spark_offsets(whole_topic(topic))
    started = time.monotonic()
    query = (parsed_events(kafka_stream(spark, topic, starting)).writeStream.format("delta").outputMode("append")
             .option("checkpointLocation", str(workdir / f"checkpoint_{path.name}"))
             .trigger(availableNow=True)
             .start(str(path)))
    query.awaitTermination()
    seconds = time.monotonic() - started
    expect("rows in the Delta table", delta_rows(path), events)
    return Job("structured_streaming_delta", events, parallelism, seconds)


def eo_delta(topic: str, events: int, parallelism: int, workdir: Path, merge: bool = False) -> Job:
    """Our Delta sink into a fresh table: appending (``eo_delta_append``) or MERGE on ``event_id``
    (``eo_delta_merge``; the table created from the output's schema, as the sink does)."""
    name = "eo_delta_merge" if merge else "eo_delta_append"
    path = workdir / f"{name}_{uuid.uuid4().hex[:6]}"
    sink = DeltaTableSink(path=str(path), key_columns=["event_id"] if merge else [])
    job = ours(name, sink, None, topic, events, parallelism)
    expect("rows in the Delta table", delta_rows(path), events)
    return job


ICEBERG_CATALOG = "bench"


def iceberg_rows(workdir: Path, table: str) -> int:
    """The rows of the Iceberg table ``bench.b.<table>``, as pyiceberg reads its metadata and files (nothing of
    Spark's)."""
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(str(workdir / "b" / table)).scan().to_arrow().num_rows


def _iceberg_table(spark: Any, name: str, staged: bool = False) -> str:
    """A fresh empty table of the parsed events' shape, made before the clock starts (each job appends or merges into
    it); ``staged``: with ``write.wap.enabled``, as our sink keeps the tables it writes."""
    from airflow_eo.iceberg.sink import WAP_ENABLED

    table = f"{ICEBERG_CATALOG}.b.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ICEBERG_CATALOG}.b")
    spark.sql(f"CREATE TABLE {table} (event_id STRING, app_id STRING, user_id STRING, ts TIMESTAMP) USING iceberg"
              + (f" TBLPROPERTIES ('{WAP_ENABLED}'='true')" if staged else ""))
    return table


def spark_iceberg_append(topic: str, events: int, parallelism: int, workdir: Path) -> Job:
    """Batch read of the same ranges, the same parsed events, ``df.writeTo(table).append()``."""
    name = f"spark_{uuid.uuid4().hex[:6]}"
    spark = spark_hook().get_conn()
    table = _iceberg_table(spark, name)
    eng = engine(parallelism)
    started = time.monotonic()
    raw = eng.read(spark, BatchContext("bench_iceberg", 0, "bench", 0, whole_topic(topic)))
    parsed_events(raw.withColumnRenamed("kafka_value", "value")).select(*EVENT_COLUMNS).writeTo(table).append()
    seconds = time.monotonic() - started
    expect("rows in the Iceberg table", iceberg_rows(workdir, name), events)
    return Job("spark_iceberg_append", events, parallelism, seconds)


def structured_streaming_iceberg(topic: str, events: int, parallelism: int, workdir: Path) -> Job:
    """``readStream`` + ``availableNow`` + a checkpoint into Iceberg's streaming sink (``writeStream.format("iceberg")
    .toTable``, as the Iceberg docs show)."""
    name = f"ss_{uuid.uuid4().hex[:6]}"
    spark = spark_hook().get_conn()
    table = _iceberg_table(spark, name)
    starting, _ = spark_offsets(whole_topic(topic))
    started = time.monotonic()
    query = (parsed_events(kafka_stream(spark, topic, starting)).select(*EVENT_COLUMNS).writeStream
             .format("iceberg").outputMode("append")
             .option("checkpointLocation", str(workdir / f"checkpoint_{name}"))
             .trigger(availableNow=True)
             .toTable(table))
    query.awaitTermination()
    seconds = time.monotonic() - started
    expect("rows in the Iceberg table", iceberg_rows(workdir, name), events)
    return Job("structured_streaming_iceberg", events, parallelism, seconds)


def eo_iceberg(topic: str, events: int, parallelism: int, workdir: Path, merge: bool = False) -> Job:
    """Our Iceberg sink into a fresh empty table, made before the clock starts as the peers' are: appending
    (``eo_iceberg_append``) or MERGE on ``event_id`` (``eo_iceberg_merge``)."""
    name = "eo_iceberg_merge" if merge else "eo_iceberg_append"
    table = f"{name}_{uuid.uuid4().hex[:6]}"
    _iceberg_table(spark_hook().get_conn(), table, staged=True)
    sink = IcebergTableSink(table=f"{ICEBERG_CATALOG}.b.{table}", warehouse=str(workdir),
                            key_columns=["event_id"] if merge else [])
    job = ours(name, sink, None, topic, events, parallelism)
    expect("rows in the Iceberg table", iceberg_rows(workdir, table), events)
    return job
