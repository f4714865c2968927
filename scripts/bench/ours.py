"""Our sinks (exactly once) on the point's topics: upsert, XA (JSON, Avro, dedup_key, per-app counts, dead
letters), PostgreSQL, Kafka transactions, and the empty batch in a fresh process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_eo.core.batch import RunRequest
from airflow_eo.core.config import BadRecordPolicy, Framing, ParseConfig, ValueFormat
from airflow_eo.core.protocol import run_batch
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import OffsetStoreHook
from airflow_eo.sinks import (
    KafkaTransactionalSink,
    MySqlUpsertSink,
    MySqlXaSink,
    PostgresTwoPhaseSink,
    PostgresUpsertSink,
)
from bench.common import (
    PG_CONN_ID,
    SCRIPT,
    Job,
    engine,
    expect,
    fresh_pg_table,
    fresh_table,
    made_seen_ids,
    made_tables,
    pg_table_rows,
    sql,
    table_rows,
)
from bench.dedup import DedupTopic
from bench.names import EMPTY_BATCH
from examples import ip_counts, page_views
from examples.topics import ensure_topic


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
    made_tables.append(dead)  # created by the sink before the batch's branches
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
    topic = DedupTopic(bootstrap, events)
    topic.first()
    table = fresh_table("page_view_events", "xadedup")
    sink = MySqlXaSink(table=table, key_columns=["event_id"])
    parse = ParseConfig(schema=page_views.SCHEMA, write_partitions=parallelism, dedup_key=("event_id",))
    made_seen_ids.append(f"bench_eo_xa_events_dedup_{topic.topic}")  # ours()'s pipeline id
    ours("eo_xa_events_dedup", sink, None, topic.topic, events, parallelism, parse=parse, run_id="previous")
    topic.second()
    job = ours("eo_xa_events_dedup", sink, None, topic.topic, events, parallelism, parse=parse)
    expect("events in the XA table, copies dropped", (table_rows(table), job_duplicates["eo_xa_events_dedup"]),
           (topic.unique_events, topic.copies))
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



def eo_empty_batch(topic: str, parallelism: int) -> Job:
    """An empty batch as a task meets it (a scheduled run with nothing new), in a fresh Python process with no
    JVM, hooks built inside the timing: the pipeline starts at ``latest``, so its batches are empty."""
    child = subprocess.run([sys.executable, str(SCRIPT), "--empty-batch", f"{topic}:{parallelism}"],
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
