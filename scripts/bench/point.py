"""One point of the sweep (a batch size and a writer parallelism), in this process: its topics produced, the
warm-ups, every wanted job in turn."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from airflow_eo.spark.jars import maven_jars
from bench import cdc
from bench.cdc_jobs import cdc_peer, eo_cdc, warm_cdc
from bench.common import CONNECTOR_J, PGJDBC, SETTINGS, DriverMemory, Job, drop_made_tables, spark_hook
from bench.dedup import spark_anti_join_dedup, structured_streaming_dedup
from bench.lakehouse import lakehouse_elsewhere
from bench.limits import r_db_elsewhere, r_kafka, warm_python_workers
from bench.names import DELTA_JOBS, EMPTY_BATCH, ICEBERG_JOBS, LIMITS, OURS, PEERS
from bench.ours import (
    eo_empty_batch,
    eo_kafka_txn,
    eo_pg,
    eo_upsert,
    eo_xa_counts,
    eo_xa_dead_letters,
    eo_xa_events,
    eo_xa_events_avro,
    eo_xa_events_dedup,
)
from bench.peers import (
    airflow_consume_from_topic,
    spark_jdbc_append,
    spark_jdbc_append_counts,
    spark_jdbc_append_pg,
    spark_kafka_writer,
    structured_streaming_foreach_batch,
)
from bench.report import print_job
from examples import ip_counts, page_views
from examples.topics import ensure_topic


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
            ("structured_streaming_dedup",
             lambda: structured_streaming_dedup(bootstrap, events, parallelism, Path(tmp))),
            ("spark_anti_join_dedup", lambda: spark_anti_join_dedup(bootstrap, events, parallelism)),
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
                (name, lambda name=name: eo_cdc(name, changes, parallelism, SETTINGS.cdc_phases))
                if name in cdc.OURS else
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
    where = SETTINGS.spark_conn_id or "local"
    for job in jobs:
        job.spark = where
    return {"events": events, "parallelism": parallelism, "spark": where, "jobs": [asdict(j) for j in jobs]}
