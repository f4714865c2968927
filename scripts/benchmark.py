"""Throughput of one micro-batch per sink, next to an at-least-once Spark baseline, in one run.

    . .stack/env && .venv/bin/python scripts/benchmark.py --events 1000000
    . .stack/env && .venv/bin/python scripts/benchmark.py --job kafka --events 1000000

Produces N page views to a fresh topic, then times on the same data: the upsert sink
(page_view_events shape), the XA sink (app_pv shape, per-app counts) and a baseline that
reads the same ranges with Spark and upserts the events from mapInArrow with the same
writer but no offset store and no protocol. Prints records/s and seconds per phase.
Numbers, not assertions: the machine is shared, so compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from airflow_eo.adapters.spark_engine import SparkBatchEngine
from airflow_eo.core.config import ParseConfig
from airflow_eo.core.protocol import BatchContext, RunRequest, run_batch
from airflow_eo.examples import page_views
from airflow_eo.examples.topics import ensure_topic
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import EoMySqlHook, OffsetStoreHook
from airflow_eo.hooks.spark import SparkSessionHook
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink


def make_table(mysql: dict, kind: str) -> str:
    example = "app_pv" if kind == "xa" else "page_view_events"
    return page_views.create_table_like(mysql, example, f"bench_{kind}_{uuid.uuid4().hex[:6]}")


def run_sink(label: str, sink, transform, topic: str, events: int) -> dict:
    kafka = KafkaClusterHook("kafka_default")
    engine = SparkBatchEngine(SparkSessionHook().get_conn, kafka.get_config(), ParseConfig(schema=page_views.SCHEMA),
                              transform=transform)
    started = time.monotonic()
    pipeline_id = f"bench_{label}_{topic}"
    summary = run_batch(RunRequest(pipeline_id=pipeline_id, run_id="bench", topics=[topic]),
                        store=OffsetStoreHook().get_store(), source=kafka.get_offset_source(), engine=engine,
                        sink=sink.adapter(pipeline_id))
    total = time.monotonic() - started
    assert summary.records_in == events, summary
    return {"label": label, "seconds": total, "phases": dict(summary.seconds), "rows_out": summary.rows_out}


def run_baseline(topic: str, table: str, events: int, bootstrap: str) -> dict:
    """At-least-once: read everything, upsert from executors, no offsets kept anywhere."""
    from airflow_eo.core.ranges import OffsetRange

    kafka = KafkaClusterHook("kafka_default")
    source = kafka.get_offset_source()
    parts = source.partition_offsets([topic], "earliest")
    ranges = tuple(OffsetRange(p.topic, p.partition, p.log_start, p.last_stable) for p in parts)
    batch = BatchContext("baseline", 0, "bench", 0, ranges)
    engine = SparkBatchEngine(SparkSessionHook().get_conn, kafka.get_config(), ParseConfig(schema=page_views.SCHEMA))
    adapter = MySqlUpsertSink(table=table, key_columns=["event_id"]).adapter("baseline")
    adapter.check()
    spark = SparkSessionHook().get_conn()
    started = time.monotonic()
    parsed, payload = engine.parse_records(spark, engine.read(spark, batch))
    out = parsed.select(*payload)
    rows = engine.run_partitions(out, adapter.partition_writer(batch, out.columns)).rows
    assert rows == events, rows
    return {"label": "baseline (at-least-once)", "seconds": time.monotonic() - started, "phases": {}, "rows_out": rows}


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def kafka_job(events: int) -> None:
    """ip_counts: N lines -> 5-second counts per IP -> a Kafka transaction; driver memory peaks."""
    from airflow_eo.examples import ip_counts
    from airflow_eo.sinks import KafkaTransactionalSink

    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    source, sink = f"bench_ip_in_{uuid.uuid4().hex[:6]}", f"bench_ip_out_{uuid.uuid4().hex[:6]}"
    ensure_topic(bootstrap, source, 3)
    ensure_topic(bootstrap, sink, 3)
    started = time.monotonic()
    ip_counts.produce_lines(bootstrap, events, topic=source)
    print(f"produced {events} lines to {source} in {time.monotonic() - started:.1f}s")
    kafka = KafkaClusterHook("kafka_default")
    spark = SparkSessionHook().get_conn()
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    engine = SparkBatchEngine(lambda: spark, kafka.get_config(), ParseConfig(value_format="string"),
                              transform=ip_counts.count_per_window_and_ip)
    adapter = KafkaTransactionalSink(topic=sink).adapter(f"bench_{source}")
    started = time.monotonic()
    summary = run_batch(RunRequest(pipeline_id=f"bench_{source}", run_id="bench", topics=[source]),
                        store=OffsetStoreHook().get_store(), source=kafka.get_offset_source(), engine=engine,
                        sink=adapter)
    seconds = time.monotonic() - started
    print(f"kafka sink: {summary.records_in} lines -> {summary.rows_out} records in {seconds:.1f}s "
          f"= {summary.records_in / seconds:,.0f} lines/s; Kafka transaction commit "
          f"{adapter.last_commit_seconds:.3f}s; phases {dict(summary.seconds)}")
    print(f"driver peak memory: python {peak_rss_mb(os.getpid()):.0f} MiB, JVM {peak_rss_mb(jvm_pid):.0f} MiB "
          f"(spark.driver.memory {spark.conf.get('spark.driver.memory')})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--job", choices=["mysql", "kafka"], default="mysql")
    args = parser.parse_args()
    if args.job == "kafka":
        kafka_job(args.events)
        return
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    mysql = EoMySqlHook().get_connect_kwargs()
    topic = f"bench_{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    page_views.produce_page_views(bootstrap, args.events, topic=topic)
    print(f"produced {args.events} events to {topic} in {time.monotonic() - started:.1f}s")
    SparkSessionHook().get_conn()  # JVM start-up is not part of any measurement below

    results = [
        run_baseline(topic, make_table(mysql, "base"), args.events, bootstrap),
        run_sink("upsert", MySqlUpsertSink(table=make_table(mysql, "upsert"), key_columns=["event_id"]),
                 None, topic, args.events),
        run_sink("xa_counts", MySqlXaSink(table=make_table(mysql, "xa"), key_columns=["app_id"],
                                          updates={"pv": "add"}), page_views.count_per_app, topic, args.events),
        run_sink("xa_events", MySqlXaSink(table=make_table(mysql, "xaev"), key_columns=["event_id"]),
                 None, topic, args.events),
        # Again at the end: the first job of a JVM pays for JIT warm-up; compare with the later one.
        run_baseline(topic, make_table(mysql, "base"), args.events, bootstrap),
    ]
    results[-1]["label"] = "baseline again (warm JVM)"
    base = results[-1]["seconds"]
    print(f"\n{'job':<26}{'seconds':>9}{'records/s':>12}{'vs baseline':>13}  phases (s)")
    for r in results:
        print(f"{r['label']:<26}{r['seconds']:>9.1f}{args.events / r['seconds']:>12,.0f}"
              f"{r['seconds'] / base:>12.2f}x  {r['phases']}")


if __name__ == "__main__":
    main()
