"""The peers of ``eo_xa_events_dedup`` (at least once), on the same events as ours: a topic of their own made the same
way (``events`` page views; a first batch, not measured, over them; then ``events`` more records of which a tenth
re-send events of either batch, half under another key), into a fresh ``page_view_events`` table whose key is the
event id, so a copy that got through would fail the job.

- ``structured_streaming_dedup``: what Spark offers for it, Structured Streaming (``readStream`` + ``availableNow`` + a
  checkpoint) with ``withWatermark`` on the Kafka timestamp (the delay: our ``dedup_retention``'s default) and
  ``dropDuplicatesWithinWatermark(["event_id"])``, its state in RocksDB (Spark's provider for big state), each
  micro-batch appended by Spark's JDBC writer in ``foreachBatch``.
- ``spark_anti_join_dedup``: a batch job as teams write it without a state store: read the new range, drop the copies
  within it, left-anti-join with the ids the table already holds (read by Spark's JDBC reader), append.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.dedup import DEFAULT_RETENTION
from airflow_eo.core.ranges import OffsetRange, spark_offsets
from bench.common import (
    EVENT_COLUMNS,
    ROWS_PER_STATEMENT,
    Job,
    engine,
    expect,
    fresh_table,
    kafka_stream,
    mysql_kwargs,
    spark_hook,
    table_rows,
    whole_topic,
)
from examples import page_views
from examples.topics import ensure_topic

PEERS = ("structured_streaming_dedup", "spark_anti_join_dedup")
#: The state store provider of the streaming peer (Spark's own, for state that outgrows the heap).
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class DedupTopic:
    """The topic of ``eo_xa_events_dedup`` and its peers: :meth:`first` the first batch's events, :meth:`second` the
    measured batch's (new events, and a tenth re-sending events of either batch); what the table must hold at the end.
    The copies re-send a sample of the events (a fiftieth, some more than once): the driver never holds them all."""

    def __init__(self, bootstrap: str, events: int, prefix: str = "bench_dedup") -> None:
        self.bootstrap, self.events = bootstrap, events
        self.topic = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.sample: list[dict[str, Any]] = []
        self.copies = 0

    def first(self) -> None:
        ensure_topic(self.bootstrap, self.topic)
        self.sample = page_views.produce_page_views(self.bootstrap, self.events, topic=self.topic, kept=0.02)

    def second(self) -> None:
        self.sample += page_views.produce_page_views(self.bootstrap, self.events - self.events // 10,
                                                     topic=self.topic, kept=0.02)
        self.copies = len(page_views.resend_page_views(self.bootstrap, self.sample, self.events // 10,
                                                       topic=self.topic, seed=self.events))
        self.sample = []

    @property
    def unique_events(self) -> int:
        return 2 * self.events - self.events // 10


def _jdbc(table: str) -> tuple[str, dict[str, str]]:
    connect = mysql_kwargs()
    url = f"jdbc:mysql://{connect['host']}:{connect['port']}/{connect['database']}?permitMysqlScheme"
    return url, {"user": connect["user"], "password": connect["password"], "driver": "org.mariadb.jdbc.Driver",
                 "batchsize": str(ROWS_PER_STATEMENT)}


def _events(df: Any, value: str = "value") -> Any:
    """The page views' columns (one ``from_json``, as the other peers) and the record's Kafka timestamp."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col(value).cast("string"), page_views.SCHEMA.replace(" NOT NULL", ""))
    return df.select(event.alias("e"), F.col("timestamp")).select(*[F.col(f"e.{c}").alias(c) for c in EVENT_COLUMNS],
                                                                  F.col("timestamp"))


def structured_streaming_dedup(bootstrap: str, events: int, parallelism: int, workdir: Path) -> Job:
    """The streaming peer: its first run over the first batch (not measured) fills its state and the table; the
    measured run reads the second batch."""
    topic = DedupTopic(bootstrap, events, "bench_dedup_ss")
    topic.first()
    table = fresh_table("page_view_events", "ssdedup")
    url, properties = _jdbc(table)
    spark = spark_hook().get_conn()
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))  # the state's partitions, fixed at the first run
    starting, _ = spark_offsets(whole_topic(topic.topic))
    checkpoint = workdir / f"checkpoint_{table}"
    delay = f"{int(DEFAULT_RETENTION.total_seconds())} seconds"

    def append(df: Any, epoch_id: int) -> None:
        df.drop("timestamp").write.jdbc(url, table, "append", properties)

    def run() -> float:
        started = time.monotonic()
        stream = (_events(kafka_stream(spark, topic.topic, starting))
                  .withWatermark("timestamp", delay).dropDuplicatesWithinWatermark(["event_id"]))
        query = (stream.writeStream.foreachBatch(append).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        return time.monotonic() - started

    try:
        run()
        expect("rows in the table after the first batch", table_rows(table), events)
        topic.second()
        seconds = run()
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        spark.conf.unset("spark.sql.shuffle.partitions")
    expect("events in the table, copies dropped", table_rows(table), topic.unique_events)
    return Job("structured_streaming_dedup", events, parallelism, seconds)


def spark_anti_join_dedup(bootstrap: str, events: int, parallelism: int) -> Job:
    """The batch peer: the first batch appended whole (not measured); the measured job reads the second batch's
    range, drops the copies within it and those whose id the table holds, and appends the rest."""
    topic = DedupTopic(bootstrap, events, "bench_dedup_aj")
    topic.first()
    table = fresh_table("page_view_events", "antijoin")
    url, properties = _jdbc(table)
    spark = spark_hook().get_conn()
    eng = engine(parallelism)

    def read(ranges: tuple[OffsetRange, ...]) -> Any:
        raw = eng.read(spark, BatchContext("bench_anti_join", 0, "bench", 0, ranges))
        return _events(raw.withColumnRenamed("kafka_value", "value").withColumnRenamed("kafka_timestamp", "timestamp"))

    first = whole_topic(topic.topic)
    read(first).dropDuplicates(["event_id"]).drop("timestamp").write.jdbc(url, table, "append", properties)
    expect("rows in the table after the first batch", table_rows(table), events)
    ends = {r.partition: r.until_offset for r in first}
    topic.second()
    second = tuple(OffsetRange(r.topic, r.partition, ends[r.partition], r.until_offset)
                   for r in whole_topic(topic.topic))
    started = time.monotonic()
    seen = spark.read.jdbc(url, f"(SELECT event_id FROM `{table}`) AS seen", properties=properties)
    new = read(second).dropDuplicates(["event_id"]).drop("timestamp").join(seen, "event_id", "left_anti")
    new.repartition(parallelism).write.jdbc(url, table, "append", properties)
    seconds = time.monotonic() - started
    expect("events in the table, copies dropped", table_rows(table), topic.unique_events)
    return Job("spark_anti_join_dedup", events, parallelism, seconds)
