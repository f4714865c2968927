"""Throughput of our sinks next to the at-least-once tools people use today and the machine's limits, in one run.

    . .stack/env && .venv/bin/python scripts/benchmark.py --sizes 1000000 --json bench.json --chart bench.png
    . .stack/env && .venv/bin/python scripts/benchmark.py --sizes 10000,100000,1000000 --parallelism 2,4
    make bench                      # the full run of the README

Every point of the sweep (a batch size and a writer parallelism) runs in its own process, so the driver's peak
memory is that point's. A point produces N page views to a fresh topic (N lines for the Kafka sink) and runs,
each on the same data and an identical fresh table:

- the limits: ``r_kafka`` (Spark reads and counts the ranges: no parse, no write) and ``r_db`` (the fastest
  load of the same rows into the same table from the same number of connections: multi-row INSERT or
  ``LOAD DATA LOCAL INFILE``, whichever is faster), ``r_db_pg`` for PostgreSQL (``COPY .. FROM STDIN`` of the
  same rows, same connections); the limit of a pipeline is min(r_kafka, r_db[_pg]) for its shape;
- the peers (at-least-once), per job (:data:`PEERS_OF`): for the events' shape, Spark Structured Streaming
  (``readStream`` + ``trigger(availableNow=True)`` + a checkpoint + ``foreachBatch`` upserting with our multi-row
  statements), Spark's JDBC writer (``df.write.jdbc`` append, MariaDB Connector/J from Maven Central) and Airflow's
  Kafka provider (``ConsumeFromTopicOperator`` with an ``apply_function_batch`` that upserts); for the per-app
  counts, Spark's JDBC append of the aggregated rows; for the Kafka sink, Spark's own Kafka writer
  (``df.write.format("kafka")``, no transactions) of the same per-window counts; for the PostgreSQL sinks,
  Spark's JDBC writer into PostgreSQL (``spark_jdbc_append_pg``, append, PostgreSQL's JDBC driver from Maven
  Central); for the Delta Lake sink, a Spark batch ``df.write.format("delta").mode("append")`` of the same parsed
  events (``spark_delta_append``) and Structured Streaming from the topic into Delta's own streaming sink
  (``structured_streaming_delta``: ``writeStream.format("delta")`` + ``availableNow`` + a checkpoint, no
  ``foreachBatch``); for the Iceberg sink the same two ways into an Iceberg table of a Hadoop catalog
  (``spark_iceberg_append``: ``df.writeTo(table).append()``; ``structured_streaming_iceberg``:
  ``writeStream.format("iceberg")`` + ``availableNow`` + a checkpoint);
- ours (exactly once): the upsert sink and the XA sink into ``page_view_events``' shape (and the XA sink reading
  the same events as Confluent-framed Avro, ``eo_xa_events_avro``, with the JSON job as its peer), the XA sink's
  per-app counts (``app_pv``), the Kafka transactional sink (``ip_counts``), and every record bad and dead-lettered by
  the XA sink, written by the executors (``eo_xa_dead_letters``) and, for comparison, streamed through the driver
  (``eo_xa_dead_letters_via_driver``, the path of sinks without an executor-side dead-letter writer); on
  PostgreSQL, the upsert sink (``eo_pg_upsert``) and the two-phase sink (``eo_pg_two_phase``) into
  ``page_view_events``' shape, with the offset store on the same PostgreSQL database (as ``page_views_pg``); the
  Delta Lake sink appending (``eo_delta_append``) and MERGE on ``event_id`` (``eo_delta_merge``) into a fresh table
  on the local disk, and the Iceberg sink the same two ways (``eo_iceberg_append``, ``eo_iceberg_merge``). The Delta
  jobs and the Iceberg jobs run in a child process of the point, one per format: Spark takes a format's jars, SQL
  extension and catalog only when a session starts, and the point's session (the other jobs') starts without them;
- change data capture (``scripts/bench/cdc.py``), on a topic of its own: N synthetic Debezium change events (70%
  updates over N / 10 keys, 10% deletes, the rest creates) applied by our pipeline with ``changes="debezium"`` to
  MySQL (``eo_cdc_upsert``) and PostgreSQL (``eo_cdc_upsert_pg``), each against Structured Streaming's
  ``foreachBatch`` into the same database through a staging table (``structured_streaming_cdc[_pg]``), every table
  compared with the events' ground truth; ``--cdc-phases`` measures our job's phases apart.

Every job checks its output (row count, or the true counts) before its time counts. It prints records/s, the
ratio to the best peer of the job (``peer`` names it; dead letters also to the XA sink's good-record rate) and the
fraction of the limit (none for the Delta jobs: they run in another JVM than R_kafka's, and the local disk's own rate
is not measured), and with ``--json``/``--chart`` writes them (with the seconds per phase and the driver's peak
memory) as JSON and as a PNG. Numbers, not assertions: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # examples/: producers and ground truths

from bench import cdc

from airflow_eo.core.batch import BatchContext, RunRequest, WritePlan
from airflow_eo.core.config import BadRecordPolicy, Framing, ParseConfig, ValueFormat
from airflow_eo.core.protocol import run_batch
from airflow_eo.core.ranges import OffsetRange, spark_offsets
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import EoMySqlHook, OffsetStoreHook
from airflow_eo.hooks.postgres import EoPostgresHook
from airflow_eo.hooks.sinks import build_sink
from airflow_eo.hooks.spark import SparkSessionHook
from airflow_eo.mysql.sink import MySqlUpsertAdapter
from airflow_eo.mysql.sql import upsert_statement
from airflow_eo.sinks import (
    DeltaTableSink,
    IcebergTableSink,
    KafkaTransactionalSink,
    MySqlUpsertSink,
    MySqlXaSink,
    PostgresTwoPhaseSink,
    PostgresUpsertSink,
)
from airflow_eo.spark.engine import SparkBatchEngine
from airflow_eo.spark.jars import maven_jars
from examples import ip_counts, page_views
from examples.topics import ensure_topic, read_topic

#: MariaDB Connector/J for Spark's JDBC writer, from Maven Central like the Kafka connector.
CONNECTOR_J = ("org.mariadb.jdbc", "mariadb-java-client", "3.5.3")
#: PostgreSQL's JDBC driver (pgjdbc), resolved the same way (its jars are pinned in ``JAR_SHA256``).
PGJDBC = ("org.postgresql", "postgresql", "42.7.8")
PG_CONN_ID = "postgres_default"
EVENT_COLUMNS = ("event_id", "app_id", "user_id", "ts")
ROWS_PER_STATEMENT = MySqlUpsertSink(table="t", key_columns=["k"]).rows_per_statement
EVENTS_PEERS = ("structured_streaming_foreach_batch", "spark_jdbc_append", "airflow_consume_from_topic")
PG_PEERS = ("spark_jdbc_append_pg",)
#: The Delta Lake table's peers: a Spark batch append of the parsed events, Structured Streaming into Delta's own sink.
DELTA_PEERS = ("spark_delta_append", "structured_streaming_delta")
DELTA_OURS = ("eo_delta_append", "eo_delta_merge")
DELTA_JOBS = (*DELTA_PEERS, *DELTA_OURS)
#: The Iceberg table's peers, the same two ways into a table of a Hadoop catalog on the local disk.
ICEBERG_PEERS = ("spark_iceberg_append", "structured_streaming_iceberg")
ICEBERG_OURS = ("eo_iceberg_append", "eo_iceberg_merge")
ICEBERG_JOBS = (*ICEBERG_PEERS, *ICEBERG_OURS)
PEERS = (*EVENTS_PEERS, "spark_jdbc_append_counts", "spark_kafka_writer", *PG_PEERS, *DELTA_PEERS, *ICEBERG_PEERS,
         *cdc.PEERS)
DEAD_LETTERS = ("eo_xa_dead_letters", "eo_xa_dead_letters_via_driver")
PG_OURS = ("eo_pg_upsert", "eo_pg_two_phase")
OURS = ("eo_upsert", "eo_xa_events", "eo_xa_events_avro", "eo_xa_events_dedup", "eo_xa_counts", "eo_kafka_txn",
        *DEAD_LETTERS, *PG_OURS, *DELTA_OURS, *ICEBERG_OURS, *cdc.OURS)
#: The peers each job is compared with (a peer with its own kind, too): the same input and output shape. Dead letters
#: are a row per record into a table, as the events are.
PEERS_OF = {
    **{name: EVENTS_PEERS for name in (*EVENTS_PEERS, "eo_upsert", "eo_xa_events", *DEAD_LETTERS)},
    "spark_jdbc_append_counts": ("spark_jdbc_append_counts",), "eo_xa_counts": ("spark_jdbc_append_counts",),
    "spark_kafka_writer": ("spark_kafka_writer",), "eo_kafka_txn": ("spark_kafka_writer",),
    # The same pipeline and events, the values Confluent-framed Avro instead of JSON: the format's cost.
    "eo_xa_events_avro": ("eo_xa_events",),
    # The same pipeline with dedup_key on a topic where a tenth of the records re-send an event: the check's cost.
    "eo_xa_events_dedup": ("eo_xa_events",),
    # PostgreSQL: the same events into a table of the same shape on PostgreSQL.
    **{name: PG_PEERS for name in (*PG_PEERS, *PG_OURS)},
    # Delta Lake: the same parsed events into a fresh table at a local path (the MERGE against the appends too: what
    # people run today is an append).
    **{name: DELTA_PEERS for name in DELTA_JOBS},
    **{name: ICEBERG_PEERS for name in ICEBERG_JOBS},
    # Debezium change events applied to a table, against Structured Streaming's foreachBatch into the same database.
    **cdc.PEERS_OF,
}
LIMITS = ("r_kafka", "r_db", "r_db_pg")
EMPTY_BATCH = "eo_empty_batch"  # seconds, not records/s: no ratio, no limit, not in the chart
EVENTS_SHAPE = ("structured_streaming_foreach_batch", "spark_jdbc_append", "airflow_consume_from_topic",
                "eo_upsert", "eo_xa_events", "eo_xa_events_avro", "eo_xa_events_dedup")
PG_EVENTS_SHAPE = (*PG_PEERS, *PG_OURS)


@dataclass
class Job:
    """One measured job of one point of the sweep."""

    name: str
    events: int
    parallelism: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)
    note: str = ""
    records_per_s: float = 0.0
    ratio_to_best_peer: float | None = None
    #: the best peer of this job, which ``ratio_to_best_peer`` is to
    peer: str | None = None
    #: dead letters: records/s over the same sink's good-record rate (``eo_xa_events``)
    ratio_to_good_records: float | None = None
    fraction_of_limit: float | None = None
    protocol_share: float | None = None
    #: where it ran: "local", or the Airflow connection of ``--spark-conn``
    spark: str = "local"
    #: peak resident memory of the driver's Python and JVM during this job (MiB)
    driver_peak_rss_mb: dict[str, int] | None = None

    def __post_init__(self) -> None:
        self.records_per_s = self.events / self.seconds if self.seconds > 0 else 0.0


# --------------------------------------------------------------------------- helpers


def mysql_kwargs() -> dict[str, Any]:
    return EoMySqlHook().get_connect_kwargs()


def sql(statement: str, args: Sequence[Any] = ()) -> list[tuple]:
    from airflow_eo.mysql.connection import connect as mysql_connect

    conn = mysql_connect(mysql_kwargs(), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return list(cur.fetchall())
    finally:
        conn.close()


#: Tables the running job made: dropped when it ends, so that every job meets a server without the others' rows.
_made_tables: list[str] = []
_made_seen_ids: list[str] = []  # pipeline ids whose seen ids (dedup_key) the run leaves behind


def fresh_table(example: str, label: str) -> str:
    table = page_views.create_table_like(mysql_kwargs(), example, f"bench_{label}_{uuid.uuid4().hex[:6]}")
    _made_tables.append(table)
    return table


def drop_made_tables() -> None:
    from airflow_eo.core.dedup import seen_pipeline_key
    from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE

    while _made_seen_ids:  # a dedup job's ids: the next run's look-ups and inserts would pay for them
        sql(f"DELETE FROM `{SEEN_ID_TABLE}` WHERE pipeline_key = %s", (seen_pipeline_key(_made_seen_ids.pop()),))
    while _made_tables:
        sql(f"DROP TABLE IF EXISTS `{_made_tables.pop()}`")  # names made by fresh_table
    while _made_pg_tables:
        pg_sql(f'DROP TABLE IF EXISTS "{_made_pg_tables.pop()}"')  # names made by fresh_pg_table


def pg_kwargs() -> dict[str, Any]:
    return EoPostgresHook(PG_CONN_ID).get_connect_kwargs()


def pg_sql(statement: str, args: Sequence[Any] = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(**pg_kwargs(), autocommit=True) as conn:
        cur = conn.execute(statement, args)
        return cur.fetchall() if cur.description else []


_made_pg_tables: list[str] = []


def fresh_pg_table(example: str, label: str) -> str:
    """A fresh PostgreSQL table shaped like the example table ``example`` (its key included)."""
    page_views.ensure_postgres_tables(pg_kwargs())
    table = f"bench_{label}_{uuid.uuid4().hex[:6]}"
    pg_sql(f'CREATE TABLE "{table}" (LIKE {example} INCLUDING ALL)')  # example: a name of POSTGRES_TABLES_DDL
    _made_pg_tables.append(table)
    return table


def pg_table_rows(table: str) -> int:
    return int(pg_sql(f'SELECT COUNT(*) FROM "{table}"')[0][0])  # table names made by fresh_pg_table


def table_rows(table: str) -> int:
    return int(sql(f"SELECT COUNT(*) FROM `{table}`")[0][0])  # table names made by fresh_table


def expect(what: str, got: Any, wanted: Any) -> None:
    if got != wanted:
        raise AssertionError(f"{what}: got {got}, wanted {wanted}: this job's output is wrong, its time means nothing")


def whole_topic(topic: str) -> tuple[OffsetRange, ...]:
    parts = KafkaClusterHook("kafka_default").get_offset_source().partition_offsets([topic], "earliest")
    return tuple(OffsetRange(p.topic, p.partition, p.log_start, p.last_stable) for p in parts)


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


#: the Airflow connection of the Spark the jobs run on (``--spark-conn``); None: local (``AIRFLOW_EO_SPARK_MASTER``
#: or ``local[*]``)
SPARK_CONN_ID: str | None = None
#: ``--cdc-phases``: after each of our change-data-capture jobs, its phases measured apart (scripts/bench/cdc.py)
CDC_PHASES = False


def spark_hook(conf: dict[str, str] | None = None) -> SparkSessionHook:
    return SparkSessionHook(SPARK_CONN_ID, conf=conf)


def engine(parallelism: int, transform: Any = None, schema: str | None = page_views.SCHEMA,
           on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL, parse: ParseConfig | None = None
           ) -> SparkBatchEngine:
    """``parse``: how records are parsed, instead of JSON values of ``schema`` (or strings without one)."""
    parse = parse or (
        ParseConfig(schema=schema, write_partitions=parallelism, on_bad_record=on_bad_record) if schema else
        ParseConfig(value_format=ValueFormat.STRING, write_partitions=parallelism, on_bad_record=on_bad_record))
    return SparkBatchEngine(spark_hook().get_conn, KafkaClusterHook("kafka_default").get_config(), parse,
                            transform=transform)


def parsed_events(df: Any) -> Any:
    """What most teams write: one from_json with the schema, the event's columns (no bad-record handling)."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), page_views.SCHEMA.replace(" NOT NULL", ""))
    return df.select(event.alias("e")).select(*[F.col(f"e.{c}").alias(c) for c in EVENT_COLUMNS])


# --------------------------------------------------------------------------- the limits


def r_kafka(topic: str, events: int, parallelism: int) -> Job:
    eng = engine(parallelism)
    spark = spark_hook().get_conn()
    batch = BatchContext("bench_r_kafka", 0, "bench", 0, whole_topic(topic))
    started = time.monotonic()
    expect("records read", eng.read(spark, batch).count(), events)
    return Job("r_kafka", events, parallelism, time.monotonic() - started)


def warm_parse_paths(bootstrap: str, parallelism: int, events: int) -> None:
    """Runs our events job and the JDBC peer once on a small topic, not timed: the first job that parses with a
    given plan pays Spark's code generation and the JVM's compilation of it (measured: ~1.4 s of the map stage at
    300,000 events), which otherwise falls on whichever job happens to come first."""
    warm = f"bench_warm_{uuid.uuid4().hex[:8]}"
    page_views.produce_page_views(bootstrap, events, topic=warm)
    try:
        eo_xa_events(warm, events, parallelism)
        spark_jdbc_append(warm, events, parallelism)
    finally:
        drop_made_tables()


def warm_python_workers(spark: Any, parallelism: int) -> None:
    """Starts the executors' Python workers (importing pyarrow and the sinks' drivers) before any job is timed, as
    the JVM's start-up is not timed: otherwise the first of our jobs pays it and the peers (JVM only) never do."""
    def touch(batches: Any) -> Any:
        import psycopg  # noqa: F401
        import pymysql  # noqa: F401

        yield from batches

    spark.range(parallelism, numPartitions=parallelism).mapInArrow(touch, "id long").collect()


def _insert_rows(args: tuple[dict[str, Any], str, list[tuple]]) -> int:
    from airflow_eo.mysql.connection import connect as mysql_connect

    connect, table, rows = args
    conn = mysql_connect(connect, autocommit=False)
    try:
        with conn.cursor() as cur:
            full = f"INSERT INTO `{table}` ({', '.join(EVENT_COLUMNS)}) VALUES " + ", ".join(
                ["(%s, %s, %s, %s)"] * ROWS_PER_STATEMENT)
            for at in range(0, len(rows), ROWS_PER_STATEMENT):
                chunk = rows[at:at + ROWS_PER_STATEMENT]
                statement = full if len(chunk) == ROWS_PER_STATEMENT else (
                    f"INSERT INTO `{table}` ({', '.join(EVENT_COLUMNS)}) VALUES "
                    + ", ".join(["(%s, %s, %s, %s)"] * len(chunk)))
                cur.execute(statement, [v for row in chunk for v in row])
                conn.commit()
        return len(rows)
    finally:
        conn.close()


def _load_file(args: tuple[dict[str, Any], str, str]) -> int:
    # The project's connection: the server may read this one file, while it is loaded, and no other.
    from airflow_eo.mysql.connection import connect as mysql_connect
    from airflow_eo.mysql.connection import loading_local_file

    connect, table, path = args
    conn = mysql_connect(connect, autocommit=True, local_infile=True)
    try:
        with loading_local_file(conn, path), conn.cursor() as cur:
            return cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE `{table}` FIELDS TERMINATED BY '\\t' "
                               f"({', '.join(EVENT_COLUMNS)})", (path,))
    finally:
        conn.close()


def _copy_file(args: tuple[dict[str, Any], str, str]) -> int:
    import psycopg

    connect, table, path = args
    with psycopg.connect(**connect) as conn, conn.cursor() as cur:  # one transaction, committed on exit
        with cur.copy(f'COPY "{table}" ({", ".join(EVENT_COLUMNS)}) FROM STDIN') as copy, open(path, "rb") as data:
            while block := data.read(1 << 20):
                copy.write(block)
        return cur.rowcount


def r_db_elsewhere(topic: str, events: int, parallelism: int, workdir: Path, database: str = "mysql") -> Job:
    """:func:`r_db` in a process of its own: its rows in memory must not count as the driver's peak memory."""
    done = subprocess.run([sys.executable, __file__, "--r-db", f"{database}:{topic}:{events}:{parallelism}:{workdir}"],
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"r_db ({database}) failed (exit {done.returncode})")
    return Job(**json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RDB "))[4:]))


def r_db(topic: str, events: int, parallelism: int, workdir: Path, database: str = "mysql") -> Job:
    """The fastest load of the topic's rows into a fresh table from ``parallelism`` connections (processes, like
    Spark's writer tasks): on MariaDB multi-row INSERT or LOAD DATA, on PostgreSQL (``database="postgres"``,
    job ``r_db_pg``) COPY. Reading and parsing the topic, and writing the files, are not timed."""
    rows = []
    for _, value in read_topic(os.environ["EO_KAFKA_BOOTSTRAP"], topic)[0]:
        event = json.loads(value or b"{}")
        ts = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).replace(tzinfo=None)
        rows.append((event["event_id"], event["app_id"], event["user_id"], ts))
    expect("rows read", len(rows), events)
    slices = [rows[i::parallelism] for i in range(parallelism)]
    files = []
    for i, part in enumerate(slices):
        path = workdir / f"r_db_{i}.tsv"
        path.write_text("".join(f"{e}\t{a}\t{u}\t{t.isoformat(sep=' ')}\n" for e, a, u, t in part))
        files.append(str(path))
    postgres = database == "postgres"
    connect = pg_kwargs() if postgres else mysql_kwargs()
    methods: tuple[tuple[str, Callable[[Any], int], list[Any]], ...] = (
        (("copy_from_stdin", _copy_file, files),) if postgres else
        (("multi_row_insert", _insert_rows, slices), ("load_data_local_infile", _load_file, files)))
    timings = {}
    # Spawned, not forked: a fork would share (and then close) the driver's connection to its JVM.
    with ProcessPoolExecutor(parallelism, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(abs, range(parallelism)))  # the processes exist before the clock starts
        for method, work, inputs in methods:
            table = fresh_pg_table("page_view_events", "rdb") if postgres else fresh_table("page_view_events", "rdb")
            started = time.monotonic()
            done = sum(pool.map(work, [(connect, table, a) for a in inputs]))
            timings[method] = time.monotonic() - started
            loaded = pg_table_rows(table) if postgres else table_rows(table)
            expect(f"rows loaded by {method}", (done, loaded), (events, events))
            drop_made_tables()
    best = min(timings, key=lambda m: timings[m])
    return Job("r_db_pg" if postgres else "r_db", events, parallelism, timings[best],
               {k: round(v, 3) for k, v in timings.items()}, note=f"fastest: {best}")


# --------------------------------------------------------------------------- the peers


def kafka_stream(spark: Any, topic: str, starting: str) -> Any:
    """The Structured Streaming peers' source: ``readStream`` of the topic from ``starting`` (Spark's JSON of the
    whole ranges' start), read_committed."""
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", os.environ["EO_KAFKA_BOOTSTRAP"])
            .option("assign", json.dumps({topic: sorted(int(p) for p in json.loads(starting)[topic])}))
            .option("startingOffsets", starting)
            .option("kafka.isolation.level", "read_committed")
            .load())


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


# --------------------------------------------------------------------------- ours


def ours(name: str, sink: Any, transform: Any, topic: str, events: int, parallelism: int,
         schema: str | None = page_views.SCHEMA, on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL,
         wrap: Callable[[Any], Any] | None = None, store_conn_id: str | None = None,
         parse: ParseConfig | None = None, run_id: str = "bench") -> Job:
    """One batch of our sink over the whole topic; ``store_conn_id``: the offset store's connection (default: the
    default store, on MariaDB), also given to the sink (a sink on the store's database is fenced by it); ``parse``:
    see :func:`engine`."""
    kafka = KafkaClusterHook("kafka_default")
    pipeline_id = f"bench_{name}_{topic}"
    store = (OffsetStoreHook(store_conn_id) if store_conn_id else OffsetStoreHook()).get_store()
    started = time.monotonic()
    summary = run_batch(RunRequest(pipeline_id=pipeline_id, run_id=run_id, topics=[topic]),
                        store=store, source=kafka.get_offset_source(),
                        engine=engine(parallelism, transform, schema, on_bad_record, parse),
                        sink=(wrap or (lambda adapter: adapter))(build_sink(sink, pipeline_id, store_conn_id)))
    seconds = time.monotonic() - started
    expect("records in", summary.records_in, events)
    job_dead_letters[name] = summary.dead_letters
    job_duplicates[name] = summary.duplicates
    phases = dict(summary.seconds)
    job = Job(name, events, parallelism, seconds, phases)
    job.protocol_share = sum(phases.get(k, 0.0) for k in ("plan", "commit", "finalize")) / seconds
    return job


job_dead_letters: dict[str, int] = {}
job_duplicates: dict[str, int] = {}


class _ThroughTheDriver:
    """A sink adapter without its executor-side dead-letter writer: the engine streams the dead letters through the
    driver into :meth:`write_dead_letters` (the path before executors wrote them; sinks without one still take it)."""

    def __init__(self, adapter: Any) -> None:
        self._adapter = adapter

    @property
    def capabilities(self) -> Any:
        # A kind that keeps dead letters has the executors' writer (core/abilities.py, DeadLetterTable): this one's
        # capabilities say it has none, so the engine asks no writer of it.
        return dataclasses.replace(self._adapter.capabilities, dead_letters=False)

    def __getattr__(self, name: str) -> Any:
        if name == "dead_letter_writer":
            raise AttributeError(name)
        return getattr(self._adapter, name)


def eo_xa_dead_letters(lines_topic: str, events: int, parallelism: int, via_driver: bool = False) -> Job:
    """Every record bad: the text lines read with the page views' JSON schema, all dead-lettered (XA sink). Shows
    that the driver's memory does not grow with the number of dead letters."""
    name = "eo_xa_dead_letters_via_driver" if via_driver else "eo_xa_dead_letters"
    table, dead = fresh_table("page_view_events", "xadl"), f"bench_dl_{uuid.uuid4().hex[:6]}"
    _made_tables.append(dead)  # created by the sink before the batch's branches
    sink = MySqlXaSink(table=table, key_columns=["event_id"], dead_letter_table=dead)
    job = ours(name, sink, None, lines_topic, events, parallelism, on_bad_record=BadRecordPolicy.DEAD_LETTER,
               wrap=_ThroughTheDriver if via_driver else None)
    expect("dead letters (reported, in the table, rows out)",
           (job_dead_letters[name], table_rows(dead), table_rows(table)), (events, events, 0))
    expect("dead letters written through the driver", "dead_letters" in job.phases, via_driver)
    return job


def eo_upsert(topic: str, events: int, parallelism: int) -> Job:
    table = fresh_table("page_view_events", "upsert")
    job = ours("eo_upsert", MySqlUpsertSink(table=table, key_columns=["event_id"]), None, topic, events, parallelism)
    expect("rows in the upsert table", table_rows(table), events)
    return job


def eo_xa_events(topic: str, events: int, parallelism: int) -> Job:
    table = fresh_table("page_view_events", "xaev")
    job = ours("eo_xa_events", MySqlXaSink(table=table, key_columns=["event_id"]), None, topic, events, parallelism)
    expect("rows in the XA table", table_rows(table), events)
    return job


def eo_xa_events_avro(avro_topic: str, events: int, parallelism: int) -> Job:
    """``eo_xa_events`` on the same events as Confluent-framed Avro (writer schema id 2 of the page-views example,
    decoded by Spark's ``from_avro`` and resolved into the example's reader schema): no transform, the same table."""
    table = fresh_table("page_view_events", "xaavro")
    parse = ParseConfig(value_format=ValueFormat.AVRO, avro_schema=json.dumps(page_views.AVRO_SCHEMA),
                        framing=Framing.CONFLUENT,
                        writer_schemas={i: json.dumps(s) for i, s in page_views.AVRO_WRITER_SCHEMAS.items()},
                        write_partitions=parallelism)
    job = ours("eo_xa_events_avro", MySqlXaSink(table=table, key_columns=["event_id"]), None, avro_topic, events,
               parallelism, parse=parse)
    # every event's ts came through: each was decoded with its writer schema, not as a row of NULLs
    expect("rows (and their timestamps) in the XA table", tuple(sql(f"SELECT COUNT(*), COUNT(ts) FROM `{table}`")[0]),
           (events, events))
    return job


def eo_xa_events_dedup(bootstrap: str, events: int, parallelism: int) -> Job:
    """``eo_xa_events`` with ``dedup_key=["event_id"]``, its seen-id table holding the previous run's ids: a first
    batch (not measured) over ``events`` page views, then the measured batch over ``events`` records of which a tenth
    re-send events of either run (half under another key, so into another partition). The table must hold each
    event once and the batch must report every copy."""
    topic = f"bench_dedup_{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic)
    first = page_views.produce_page_views(bootstrap, events, topic=topic)
    table = fresh_table("page_view_events", "xadedup")
    sink = MySqlXaSink(table=table, key_columns=["event_id"])
    parse = ParseConfig(schema=page_views.SCHEMA, write_partitions=parallelism, dedup_key=("event_id",))
    _made_seen_ids.append(f"bench_eo_xa_events_dedup_{topic}")  # ours()'s pipeline id
    ours("eo_xa_events_dedup", sink, None, topic, events, parallelism, parse=parse, run_id="previous")
    second = page_views.produce_page_views(bootstrap, events - events // 10, topic=topic)
    copies = page_views.resend_page_views(bootstrap, first + second, events // 10, topic=topic, seed=events)
    del first
    job = ours("eo_xa_events_dedup", sink, None, topic, events, parallelism, parse=parse)
    expect("events in the XA table, copies dropped", (table_rows(table), job_duplicates["eo_xa_events_dedup"]),
           (2 * events - events // 10, len(copies)))
    return job


def eo_xa_counts(topic: str, events: int, parallelism: int) -> Job:
    table = fresh_table("app_pv", "xa")
    job = ours("eo_xa_counts", MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"}),
               page_views.count_per_app, topic, events, parallelism)
    expect("page views counted", int(sql(f"SELECT SUM(pv) FROM `{table}`")[0][0]), events)
    return job


def eo_pg(name: str, topic: str, events: int, parallelism: int) -> Job:
    """A PostgreSQL sink (``eo_pg_upsert`` or ``eo_pg_two_phase``) into ``page_view_events``' shape, the offset
    store on the same database (as ``page_views_pg``: the upsert's epoch fence runs in its statement)."""
    table = fresh_pg_table("page_view_events", name.removeprefix("eo_").replace("_", ""))
    kind = PostgresUpsertSink if name == "eo_pg_upsert" else PostgresTwoPhaseSink
    job = ours(name, kind(table=table, key_columns=["event_id"], conn_id=PG_CONN_ID), None, topic, events,
               parallelism, store_conn_id=PG_CONN_ID)
    expect(f"rows in the {name} table", pg_table_rows(table), events)
    return job


def eo_kafka_txn(lines_topic: str, events: int, parallelism: int) -> Job:
    out = f"{lines_topic}_out"
    ensure_topic(os.environ["EO_KAFKA_BOOTSTRAP"], out, 3)
    return ours("eo_kafka_txn", KafkaTransactionalSink(topic=out), ip_counts.count_per_window_and_ip, lines_topic,
                events, parallelism, schema=None)


def _cdc_database(name: str) -> tuple[str, dict[str, Any], list[str]]:
    """The database of a change-data-capture job, its login and the list its tables are dropped from."""
    database = cdc.database_of(name)
    postgres = database == "postgres"
    return database, pg_kwargs() if postgres else mysql_kwargs(), _made_pg_tables if postgres else _made_tables


def cdc_peer(name: str, changes: cdc.Changes, parallelism: int, workdir: Path) -> Job:
    """``structured_streaming_cdc[_pg]`` (scripts/bench/cdc.py) into a fresh table; it must equal the ground truth."""
    database, kwargs, made = _cdc_database(name)
    table = cdc.create_table(database, kwargs, "sscdc")
    made.append(table)
    spark = spark_hook().get_conn()
    starting, _ = spark_offsets(whole_topic(changes.topic))
    seconds, phases = cdc.structured_streaming_cdc(spark, kafka_stream(spark, changes.topic, starting), database,
                                                   kwargs, table, parallelism, ROWS_PER_STATEMENT,
                                                   workdir / f"checkpoint_{table}")
    return Job(name, changes.events, parallelism, seconds, phases,
               note=cdc.check_target(database, kwargs, table, changes.truth))


def eo_cdc(name: str, changes: cdc.Changes, parallelism: int, phases: bool = False) -> Job:
    """``eo_cdc_upsert[_pg]``: our pipeline with ``changes="debezium"`` into a fresh table (the offset store on the
    sink's database, as ``eo_pg_upsert``); it must equal the ground truth. ``phases``: then measured apart."""
    database, kwargs, made = _cdc_database(name)
    table = cdc.create_table(database, kwargs, "eocdc")
    made.append(table)
    store = PG_CONN_ID if database == "postgres" else None
    spec, parse = cdc.sink(database, table, PG_CONN_ID), cdc.parse_config(parallelism)
    try:
        job = ours(name, spec, None, changes.topic, changes.events, parallelism, parse=parse, store_conn_id=store)
        job.note = cdc.check_target(database, kwargs, table, changes.truth)
        if phases:
            profile = f"bench_cdc_profile_{uuid.uuid4().hex[:8]}"
            job.phases.update(cdc.profile_ours(engine(parallelism, parse=parse), spark_hook().get_conn(),
                                               build_sink(spec, profile, store),
                                               BatchContext(profile, 0, "bench", 0, whole_topic(changes.topic)),
                                               job.phases))
    finally:
        cdc.forget_positions(database, kwargs, f"bench_{name}_{changes.topic}")  # ours()'s pipeline id
    return job


def warm_cdc(bootstrap: str, names: Sequence[str], parallelism: int, events: int, workdir: Path) -> None:
    """The change-data-capture jobs once on a small topic, not timed (as :func:`warm_parse_paths`)."""
    changes = cdc.produce_changes(bootstrap, events, topic=f"bench_warm_cdc_{uuid.uuid4().hex[:8]}")
    try:
        for name in names:
            (eo_cdc if name in cdc.OURS else lambda n, c, p: cdc_peer(n, c, p, workdir))(name, changes, parallelism)
    finally:
        drop_made_tables()


# --------------------------------------------------------------------------- Delta Lake, in a process of its own


def lakehouse_elsewhere(fmt: str, topic: str, events: int, parallelism: int, workdir: Path,
                        names: Sequence[str]) -> list[Job]:
    """The ``fmt`` jobs (``delta``, ``iceberg``) ``names`` in a child process: Spark takes a format's SQL extension
    and catalog only when a session starts, and the point's session started without them (its other jobs run as they
    always did)."""
    done = subprocess.run([sys.executable, __file__, f"--{fmt}",
                           f"{topic}:{events}:{parallelism}:{','.join(names)}:{workdir}",
                           *(["--spark-conn", SPARK_CONN_ID] if SPARK_CONN_ID else [])],
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


def eo_empty_batch(topic: str, parallelism: int) -> Job:
    """An empty batch as a task meets it (a scheduled run with nothing new), in a fresh Python process with no
    JVM, hooks built inside the timing: the pipeline starts at ``latest``, so its batches are empty."""
    child = subprocess.run([sys.executable, __file__, "--empty-batch", f"{topic}:{parallelism}"],
                           stdout=subprocess.PIPE, text=True)
    lines = child.stdout.splitlines()
    if child.returncode != 0 or not any(line.startswith("EMPTY ") for line in lines):
        raise AssertionError(f"the empty batch failed (exit {child.returncode}): {child.stdout[-2000:]}")
    return Job(**json.loads(next(line for line in lines if line.startswith("EMPTY "))[6:]))


def empty_batch_in_this_process(topic: str, parallelism: int) -> Job:
    pipeline_id = f"bench_empty_{uuid.uuid4().hex[:8]}"
    table = fresh_table("page_view_events", "empty")
    seconds, phases = [], {}
    for run in ("first", "second"):  # the first declares the pipeline; the second is every later empty run
        started = time.monotonic()
        summary = run_batch(RunRequest(pipeline_id=pipeline_id, run_id=run, topics=[topic], starting_offsets="latest"),
                            store=OffsetStoreHook().get_store(), source=KafkaClusterHook("kafka_default")
                            .get_offset_source(), engine=engine(parallelism),
                            sink=build_sink(MySqlUpsertSink(table=table, key_columns=["event_id"]), pipeline_id))
        seconds.append(time.monotonic() - started)
        expect("records in an empty batch", summary.records_in, 0)
        phases = dict(summary.seconds)
    from pyspark import SparkContext

    expect("a Spark context started by the empty batches", SparkContext._active_spark_context, None)
    java = [p for p in Path("/proc").glob("[0-9]*") if _parent_pid(p) == os.getpid()]
    expect("child processes (a JVM) started by the empty batches", java, [])
    return Job(EMPTY_BATCH, 0, parallelism, seconds[1], {**phases, "first_run": round(seconds[0], 3)},
               note="no Spark started")


def _parent_pid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class DriverMemory:
    """Peak resident memory of the driver (this Python and its JVM) per job: the kernel's high-water mark
    (``VmHWM``), reset before each job (``clear_refs`` 5), so that one job's peak is not another's."""

    def __init__(self, jvm_pid: int) -> None:
        self.pids = {"python": os.getpid(), "jvm": jvm_pid}

    def reset(self) -> None:
        for pid in self.pids.values():
            Path(f"/proc/{pid}/clear_refs").write_text("5")

    def peak_mb(self) -> dict[str, int]:
        return {name: round(peak_rss_mb(pid)) for name, pid in self.pids.items()}


# --------------------------------------------------------------------------- one point, the sweep


def run_point(events: int, parallelism: int, only: Sequence[str]) -> dict[str, Any]:
    """Everything at one batch size and parallelism, in this process."""
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    topic, lines_topic = f"bench_{uuid.uuid4().hex[:8]}", f"bench_lines_{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    wanted = set(only) if only else {*LIMITS, *PEERS, *OURS, EMPTY_BATCH}
    cdc_jobs = [name for name in cdc.JOBS if name in wanted]
    page_jobs = bool(wanted - set(cdc.JOBS))  # the page views and lines: every job but the change-data-capture ones
    avro_topic = f"{topic}_avro"
    if page_jobs:
        produced = page_views.produce_page_views(bootstrap, events, topic=topic)
        if "eo_xa_events_avro" in wanted:  # the same events, keys and partitions, framed Avro (schema id 2, with ts)
            ensure_topic(bootstrap, avro_topic)
            page_views.produce_avro_page_views(bootstrap, avro_topic, produced, schema_ids=(2,))
        del produced
        ensure_topic(bootstrap, lines_topic, 3)
        ip_counts.produce_lines(bootstrap, events, topic=lines_topic)
        avro = f" (and as Avro to {avro_topic})" if "eo_xa_events_avro" in wanted else ""
        print(f"[{events:,} events, {parallelism} writers] produced {events:,} page views to {topic}{avro} and "
              f"{events:,} lines to {lines_topic} in {time.monotonic() - started:.1f}s", flush=True)
    changes = None
    if cdc_jobs:
        started = time.monotonic()
        changes = cdc.produce_changes(bootstrap, events)
        print(f"[{events:,} events, {parallelism} writers] produced {events:,} Debezium change events of "
              f"{changes.keys:,} keys to {changes.topic} ({dict(changes.ops)}; {len(changes.truth):,} rows at the "
              f"end) in {time.monotonic() - started:.1f}s", flush=True)
    jars = [*(maven_jars(*CONNECTOR_J) or []), *(maven_jars(*PGJDBC) or [])]
    spark = spark_hook({"spark.jars": ",".join(jars)}).get_conn()  # JVM start-up is not measured
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    # warm-up, not measured: the first Spark job of a JVM is slow
    r_kafka(changes.topic if changes is not None and not page_jobs else lines_topic, events, parallelism)
    warm_python_workers(spark, parallelism)
    if page_jobs:
        warm_parse_paths(bootstrap, parallelism, min(events, 20_000))
    jobs: list[Job] = []
    with tempfile.TemporaryDirectory(prefix="eo_bench_") as tmp:
        runs: list[tuple[str, Callable[[], Job]]] = [
            ("r_kafka", lambda: r_kafka(topic, events, parallelism)),
            ("r_kafka_lines", lambda: r_kafka(lines_topic, events, parallelism)),
            ("r_db", lambda: r_db_elsewhere(topic, events, parallelism, Path(tmp))),
            ("structured_streaming_foreach_batch",
             lambda: structured_streaming_foreach_batch(topic, events, parallelism, Path(tmp))),
            ("spark_jdbc_append", lambda: spark_jdbc_append(topic, events, parallelism)),
            ("airflow_consume_from_topic", lambda: airflow_consume_from_topic(topic, events, parallelism)),
            ("eo_upsert", lambda: eo_upsert(topic, events, parallelism)),
            ("eo_xa_events", lambda: eo_xa_events(topic, events, parallelism)),
            ("eo_xa_events_avro", lambda: eo_xa_events_avro(avro_topic, events, parallelism)),
            ("eo_xa_events_dedup", lambda: eo_xa_events_dedup(bootstrap, events, parallelism)),
            ("spark_jdbc_append_counts", lambda: spark_jdbc_append_counts(topic, events, parallelism)),
            ("eo_xa_counts", lambda: eo_xa_counts(topic, events, parallelism)),
            ("spark_kafka_writer", lambda: spark_kafka_writer(lines_topic, events, parallelism)),
            ("eo_kafka_txn", lambda: eo_kafka_txn(lines_topic, events, parallelism)),
            ("eo_xa_dead_letters_via_driver",
             lambda: eo_xa_dead_letters(lines_topic, events, parallelism, via_driver=True)),
            ("eo_xa_dead_letters", lambda: eo_xa_dead_letters(lines_topic, events, parallelism)),
            ("r_db_pg", lambda: r_db_elsewhere(topic, events, parallelism, Path(tmp), "postgres")),
            ("spark_jdbc_append_pg", lambda: spark_jdbc_append_pg(topic, events, parallelism)),
            ("eo_pg_upsert", lambda: eo_pg("eo_pg_upsert", topic, events, parallelism)),
            ("eo_pg_two_phase", lambda: eo_pg("eo_pg_two_phase", topic, events, parallelism)),
            (EMPTY_BATCH, lambda: eo_empty_batch(topic, parallelism)),
        ]
        if changes is not None:
            cdc_runs: list[tuple[str, Callable[[], Job]]] = [
                (name, lambda name=name: eo_cdc(name, changes, parallelism, CDC_PHASES)) if name in cdc.OURS else
                (name, lambda name=name: cdc_peer(name, changes, parallelism, Path(tmp))) for name in cdc.JOBS]
            # each database's peer, then ours
            runs += sorted(cdc_runs, key=lambda run: (cdc.database_of(run[0]), run[0] in cdc.OURS))
            # a tenth of the events: the plans compile at any size (a small setting then pays less for it)
            warm_cdc(bootstrap, cdc_jobs, parallelism, min(max(events // 10, 100), 20_000), Path(tmp))
        memory = DriverMemory(jvm_pid)
        for name, run in runs:
            if name.removesuffix("_lines") not in wanted:
                continue
            memory.reset()
            try:
                job = run()
            finally:
                drop_made_tables()
            job.name = name
            job.driver_peak_rss_mb = memory.peak_mb()
            jobs.append(job)
            print_job(job)
        for fmt, fmt_jobs in (("delta", DELTA_JOBS), ("iceberg", ICEBERG_JOBS)):
            chosen = [name for name in fmt_jobs if name in wanted]
            if chosen:
                jobs += lakehouse_elsewhere(fmt, topic, events, parallelism, Path(tmp) / fmt, chosen)
    where = SPARK_CONN_ID or "local"
    for job in jobs:
        job.spark = where
    return {"events": events, "parallelism": parallelism, "spark": where, "jobs": [asdict(j) for j in jobs]}


def print_job(job: Job) -> None:
    print(f"  {job.name:<36}{job.seconds:>8.1f}s {job.records_per_s:>12,.0f} records/s  "
          f"driver peak RSS {job.driver_peak_rss_mb}  {job.note}", flush=True)


def rate_point(point: dict[str, Any]) -> None:
    """Ratios within one point: to the best peer, to the limit of the job's shape."""
    jobs = {j["name"]: j for j in point["jobs"]}
    kafka, db = jobs.get("r_kafka", {}).get("records_per_s"), jobs.get("r_db", {}).get("records_per_s")
    good = jobs.get("eo_xa_events", {}).get("records_per_s")
    for job in point["jobs"]:
        peers = [p for p in PEERS_OF.get(job["name"], ()) if p in jobs]
        if peers:
            best = max(peers, key=lambda p: jobs[p]["records_per_s"])
            job["peer"] = best
            job["ratio_to_best_peer"] = round(job["records_per_s"] / jobs[best]["records_per_s"], 3)
        if job["name"] in DEAD_LETTERS and good:
            job["ratio_to_good_records"] = round(job["records_per_s"] / good, 3)
        if job["name"] in EVENTS_SHAPE and kafka and db:
            limit = min(kafka, db)
        elif job["name"] in PG_EVENTS_SHAPE and kafka and "r_db_pg" in jobs:
            limit = min(kafka, jobs["r_db_pg"]["records_per_s"])
        elif job["name"] in ("eo_xa_counts", "spark_jdbc_append_counts") and kafka:
            limit = kafka  # a few rows out: the database is not the limit
        elif job["name"] in ("eo_kafka_txn", "spark_kafka_writer") and "r_kafka_lines" in jobs:
            limit = jobs["r_kafka_lines"]["records_per_s"]
        else:
            continue
        job["fraction_of_limit"] = round(job["records_per_s"] / limit, 3)


def print_point(point: dict[str, Any]) -> None:
    print(f"\n{point['events']:,} events, {point['parallelism']} writers, Spark: {point['spark']}")
    print(f"{'job':<36}{'seconds':>9}{'records/s':>12}{'x best peer':>22}{'best peer':>30}{'of limit':>10}"
          f"{'protocol':>10}{'driver MiB (py/JVM)':>21}  phases (s)")
    for j in point["jobs"]:
        ratio = f"{j['ratio_to_best_peer']:.2f}" if j["ratio_to_best_peer"] is not None else "-"
        if j.get("ratio_to_good_records") is not None:
            ratio += f" ({j['ratio_to_good_records']:.2f}x good)"
        limit = f"{j['fraction_of_limit']:.2f}" if j["fraction_of_limit"] is not None else "-"
        protocol = f"{j['protocol_share']:.1%}" if j["protocol_share"] is not None else "-"
        rss = j["driver_peak_rss_mb"] or {}
        memory = f"{rss.get('python', '-')}/{rss.get('jvm', '-')}"
        print(f"{j['name']:<36}{j['seconds']:>9.1f}{j['records_per_s']:>12,.0f}{ratio:>22}{j.get('peer') or '-':>30}"
              f"{limit:>10}{protocol:>10}{memory:>21}  {j['phases'] or j['note']}")


def print_scale_out(points: list[dict[str, Any]]) -> None:
    """Per batch size: each job's records/s at each parallelism, per writer task, and against the first one."""
    for events in sorted({p["events"] for p in points}):
        mine = sorted((p for p in points if p["events"] == events), key=lambda p: p["parallelism"])
        print(f"\nscale-out, {events:,} events on {mine[0]['spark']}: records/s (per writer task; x the first)")
        print(f"{'job':<36}" + "".join(f"{str(p['parallelism']) + ' writers':>32}" for p in mine))
        names = [j["name"] for j in mine[0]["jobs"] if j["records_per_s"]]
        for name in names:
            rates = [next((j["records_per_s"] for j in p["jobs"] if j["name"] == name), None) for p in mine]
            cells = [f"{r:>12,.0f} ({r / p['parallelism']:>8,.0f}; {r / rates[0]:.2f}x)" if r and rates[0] else "-"
                     for r, p in zip(rates, mine, strict=True)]
            print(f"{name:<36}" + "".join(f"{c:>32}" for c in cells))


def chart(points: list[dict[str, Any]], path: Path) -> None:
    """records/s per job against batch size, one panel per parallelism, the limit dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parallelisms = sorted({p["parallelism"] for p in points})
    fig, axes = plt.subplots(1, len(parallelisms), figsize=(7 * len(parallelisms), 5), squeeze=False)
    for ax, parallelism in zip(axes[0], parallelisms, strict=True):
        mine = sorted((p for p in points if p["parallelism"] == parallelism), key=lambda p: p["events"])
        sizes = [p["events"] for p in mine]
        names = [n for n in (*PEERS, *OURS) if any(j["name"] == n for p in mine for j in p["jobs"])]
        for name in names:
            rates = [next((j["records_per_s"] for j in p["jobs"] if j["name"] == name), None) for p in mine]
            ax.plot(sizes, rates, marker="o", linestyle="-" if name in OURS else ":", label=name)
        limits = []
        for p in mine:
            by_name = {j["name"]: j["records_per_s"] for j in p["jobs"]}
            limits.append(min(by_name["r_kafka"], by_name["r_db"]) if {"r_kafka", "r_db"} <= set(by_name) else None)
        ax.plot(sizes, limits, color="black", linestyle="--", marker="_", markersize=14, linewidth=2,
                label="limit: min(R_kafka, R_db)")
        ax.set_xscale("log")
        ax.set_xlabel("events per batch")
        ax.set_ylabel("records/s")
        ax.set_title(f"{parallelism} writer tasks / connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000", help="comma-separated batch sizes (events), e.g. 10000,100000")
    parser.add_argument("--parallelism", default="2", help="comma-separated writer parallelism (tasks, connections)")
    parser.add_argument("--only", default="",
                        help=f"comma-separated jobs among {', '.join((*LIMITS, *PEERS, *OURS, EMPTY_BATCH))}")
    parser.add_argument("--spark-conn", default=None,
                        help="the Airflow connection of the Spark to run on, e.g. spark_cluster (`make spark-cluster`, "
                             "then `. .stack/spark/env`); default: local")
    parser.add_argument("--cdc-phases", action="store_true",
                        help="after each of our change-data-capture jobs, run its stages apart (untimed) to report "
                             "where its time goes (phases p_read, p_parse, p_newest, p_lookup)")
    parser.add_argument("--json", type=Path, help="write the results here (one object per job)")
    parser.add_argument("--chart", type=Path, help="write a PNG chart of records/s here (needs matplotlib)")
    parser.add_argument("--point", help=argparse.SUPPRESS)  # internal: run one point, print its JSON
    parser.add_argument("--r-db", help=argparse.SUPPRESS)  # internal: run r_db, print its JSON
    parser.add_argument("--empty-batch", help=argparse.SUPPRESS)  # internal: time empty batches, print the JSON
    parser.add_argument("--delta", help=argparse.SUPPRESS)  # internal: run the Delta jobs, print their JSON
    parser.add_argument("--iceberg", help=argparse.SUPPRESS)  # internal: the same for the Iceberg jobs
    args = parser.parse_args()
    global SPARK_CONN_ID, CDC_PHASES
    SPARK_CONN_ID, CDC_PHASES = args.spark_conn, args.cdc_phases
    only = [o for o in args.only.split(",") if o]
    if args.empty_batch:
        topic, parallelism = args.empty_batch.rsplit(":", 1)
        job = empty_batch_in_this_process(topic, int(parallelism))
        print("EMPTY " + json.dumps({k: v for k, v in asdict(job).items() if k != "records_per_s"}), flush=True)
        return
    for fmt, point in (("delta", delta_point), ("iceberg", iceberg_point)):
        if getattr(args, fmt):
            topic, events, parallelism, names, workdir = getattr(args, fmt).split(":", 4)
            Path(workdir).mkdir(parents=True, exist_ok=True)
            found = point(topic, int(events), int(parallelism), Path(workdir), names.split(","))
            print(f"{fmt.upper()} " + json.dumps([{k: v for k, v in asdict(job).items() if k != "records_per_s"}
                                                   for job in found]), flush=True)
            return
    if args.r_db:
        database, topic, events, parallelism, workdir = args.r_db.split(":", 4)
        job = r_db(topic, int(events), int(parallelism), Path(workdir), database)
        print("RDB " + json.dumps({k: v for k, v in asdict(job).items() if k != "records_per_s"}), flush=True)
        return
    if args.point:
        events, parallelism = (int(v) for v in args.point.split(":"))
        result = run_point(events, parallelism, only)
        print("POINT " + json.dumps(result), flush=True)
        return
    points = []
    for events in (int(s) for s in args.sizes.split(",")):
        for parallelism in (int(p) for p in args.parallelism.split(",")):
            # Its own process: the driver's peak memory and JVM are this point's alone.
            where = ["--spark-conn", args.spark_conn] if args.spark_conn else []
            child = subprocess.run([sys.executable, __file__, "--point", f"{events}:{parallelism}",
                                    "--only", args.only, *where, *(["--cdc-phases"] if args.cdc_phases else [])],
                                   stdout=subprocess.PIPE, text=True)
            lines = child.stdout.splitlines()
            print("\n".join(line for line in lines if not line.startswith("POINT ")), flush=True)
            if child.returncode != 0:
                sys.exit(f"the point {events}:{parallelism} failed (exit {child.returncode})")
            point = json.loads(next(line for line in lines if line.startswith("POINT "))[6:])
            rate_point(point)
            points.append(point)
            print_point(point)
    if len({p["parallelism"] for p in points}) > 1:
        print_scale_out(points)
    if args.json:
        jobs = [job for p in points for job in p["jobs"]]
        args.json.write_text(json.dumps(jobs, indent=1))
        print(f"json: {args.json} ({len(jobs)} jobs)")
    if args.chart:
        chart(points, args.chart)


if __name__ == "__main__":
    main()
