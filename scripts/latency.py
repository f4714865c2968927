"""Produce-to-visible latency of event-driven runs (``dags/page_view_events_on_arrival.py``) under a real Airflow.

    make up && . .stack/env && .venv/bin/python scripts/latency.py [--bursts 20 --records 1000 --gaps 5,30]

A throwaway Airflow deployment on loopback (``tests/scheduler/airflow_services.py``: api-server, scheduler,
dag-processor and triggerer, LocalExecutor, PostgreSQL metadata database) runs the example DAG, pointed at a fresh
topic and pipeline id (the file's two names replaced, nothing else). After one warm-up burst (not counted: the first
run also finds the watcher starting), ``--bursts`` bursts of ``--records`` page views are produced at random gaps
(uniform in ``--gaps`` seconds), and nothing else starts a run: ``EoBacklogTrigger`` fires, the scheduler starts
runs. Once every record is committed, a quiet period follows in which no run may start (nothing new arrived).

Latency of a record = its batch's commit time in the offset store (``eo_batch.committed_at``) minus the record's
Kafka timestamp (the producer's CreateTime); p50 / p95 / max over every record of the bursts. Where the time goes,
per batch from its oldest record (medians): until the trigger's asset event (poll, threshold, or held while the
run before it was running), until the scheduler queued the run, until the task started, until the batch was
planned (the task's start-up: imports, take, recover, plan), until it committed (Spark's start, the batch, the
commit; the summary's phases). It checks, and says, that every produced event is in the sink once, that every run
succeeded and that no run started in the quiet period; the exit status is non-zero otherwise.

``--short`` (3 bursts of 200 records, gaps of 2 to 6 s, a 20 s quiet period) is what
``tests/scheduler/test_event_driven_runs.py`` runs so that this script cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # examples/ and tests/ (the deployment)

from airflow_eo.hooks.mysql import EoMySqlHook  # noqa: E402
from airflow_eo.hooks.offset_store import OffsetStoreHook  # noqa: E402
from airflow_eo.kafka.offsets import KafkaOffsetSource  # noqa: E402
from examples import page_views  # noqa: E402
from examples.topics import read_records  # noqa: E402
from tests.scheduler.airflow_rest import from_iso  # noqa: E402
from tests.scheduler.airflow_services import AirflowServices  # noqa: E402

EXAMPLE = REPO / "dags" / "page_view_events_on_arrival.py"
SEGMENTS = (  # (name, from, to): the timeline of one batch, from its oldest record
    ("trigger fired (poll, threshold, triggerer; or held while the run before ran)", "oldest_record", "event"),
    ("scheduler created and started the run", "event", "run_started"),
    ("scheduler queued the task to the executor", "run_started", "task_queued"),
    ("executor started the task's process", "task_queued", "task_started"),
    ("task planned the batch (DAG file parsed, operator set up, take, recover, plan)", "task_started", "planned"),
    ("batch committed (Spark session + batch + commit)", "planned", "committed"),
)
#: the summary's phases timed by the protocol; the rest are the engine's Spark jobs, inside "execute"
PROTOCOL_PHASES = frozenset({"plan", "execute", "commit", "finalize"})


def example_dag(pipeline_id: str, topic: str, spark_conn_id: str = "") -> str:
    """The example DAG's text with its pipeline id (also its DAG id), topic and default Spark connection replaced."""
    text = EXAMPLE.read_text()
    for old, new, count in (('PIPELINE = "page_view_events_on_arrival"', f"PIPELINE = {pipeline_id!r}", 1),
                            ("page_views.TOPIC", repr(topic), 2),
                            ('"spark_conn_id": Param("",', f'"spark_conn_id": Param({spark_conn_id!r},', 1)):
        if text.count(old) != count:
            raise SystemExit(f"{EXAMPLE} changed: expected {old!r} {count} time(s); update scripts/latency.py")
        text = text.replace(old, new)
    return text


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def wait(check: Callable[[], bool], timeout: float, what: str, airflow: AirflowServices, dag_id: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}\n{airflow.diagnostics(dag_id)}")
        time.sleep(0.5)


def all_committed(source: KafkaOffsetSource, store: Any, pipeline_id: str, topic: str) -> bool:
    ends = source.last_stable(source.partitions([topic]))
    committed = store.committed_offsets(pipeline_id)
    return all(committed.get(k, 0) >= end for k, end in ends.items())


def batch_of(batches: Iterable[Any], partition: int, offset: int, topic: str) -> Any:
    for info in batches:
        if any(r.topic == topic and r.partition == partition and r.from_offset <= offset < r.until_offset
               for r in info.record.ranges):
            return info
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--records", type=int, default=1000, help="records per burst")
    parser.add_argument("--gaps", default="5,30", help="min,max seconds between two bursts (uniform)")
    parser.add_argument("--quiet", type=float, default=30.0, help="seconds after the last commit with no new run")
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--short", action="store_true", help="3 bursts of 200 records, gaps 2-6 s, 20 s quiet")
    parser.add_argument("--spark-conn-id", default="", help="where the runs' Spark runs (a spark or spark_connect "
                        "connection in the environment, e.g. spark_connect of `make spark-cluster`); default: "
                        "local[*] in the task")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--keep", help="keep the deployment's AIRFLOW_HOME and logs in this folder")
    args = parser.parse_args(argv)
    if args.short:
        args.bursts, args.records, args.gaps, args.quiet = 3, 200, "2,6", 20.0
    low, high = (float(x) for x in args.gaps.split(","))
    rng = random.Random(args.seed)
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    suffix = uuid.uuid4().hex[:8]
    topic, dag_id = f"latency_{suffix}", f"latency_on_arrival_{suffix}"
    page_views.ensure_topic(bootstrap, topic)
    mysql = EoMySqlHook("mysql_default").get_connect_kwargs()
    page_views.ensure_tables(mysql)
    store = OffsetStoreHook().get_store()
    source = KafkaOffsetSource({"bootstrap.servers": bootstrap})

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="latency-"))
    dags = base / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    (dags / f"{dag_id}.py").write_text(example_dag(dag_id, topic, args.spark_conn_id))
    env = {k: v for k, v in os.environ.items() if k.startswith(("AIRFLOW_CONN_", "EO_SPARK_"))}
    produced: list[dict[str, Any]] = []
    started = time.monotonic()
    with AirflowServices(dags, env=env, base_dir=base / "airflow", triggerer=True) as airflow:
        print(f"latency: deployment up in {airflow.timings.get('start_total_s', 0):.0f} s; DAG {dag_id}, "
              f"topic {topic}", flush=True)
        airflow.wait_for_dag(dag_id, timeout=180)
        airflow.unpause(dag_id)

        # Warm-up: the watcher starts in the triggerer, the first run makes its JVM's caches; not counted.
        page_views.produce_page_views(bootstrap, args.records, topic)
        wait(lambda: all_committed(source, store, dag_id, topic), 600, "the warm-up burst's commit", airflow, dag_id)
        warm_ends = source.last_stable(source.partitions([topic]))
        warmup_runs = len(airflow.dag_runs(dag_id))
        print(f"latency: warm-up committed by {warmup_runs} run(s), {time.monotonic() - started:.0f} s in",
              flush=True)

        for burst in range(args.bursts):
            produced += page_views.produce_page_views(bootstrap, args.records, topic)
            if burst < args.bursts - 1:
                time.sleep(rng.uniform(low, high))
        wait(lambda: all_committed(source, store, dag_id, topic), 900, "every burst's commit", airflow, dag_id)
        runs_at_rest = len(airflow.dag_runs(dag_id))
        time.sleep(args.quiet)
        runs = airflow.dag_runs(dag_id)
        details = {run["dag_run_id"]: (airflow.task_instances(dag_id, run["dag_run_id"]),
                                       airflow.upstream_asset_events(dag_id, run["dag_run_id"])) for run in runs}
    elapsed = time.monotonic() - started

    batches = [b for b in store.batch_history(dag_id, limit=10_000) if b.committed_at is not None]
    records, _ = read_records(bootstrap, topic)
    measured = [r for r in records if r.offset >= warm_ends[(topic, r.partition)]]
    latencies: list[float] = []
    oldest: dict[int, int] = {}  # batch id -> its oldest measured record's timestamp (ms)
    for r in measured:
        info = batch_of(batches, r.partition, r.offset, topic)
        latencies.append(info.committed_at.timestamp() - r.timestamp_ms / 1000)
        oldest[info.record.batch_id] = min(oldest.get(info.record.batch_id, r.timestamp_ms), r.timestamp_ms)

    by_run = {run["dag_run_id"]: run for run in runs}
    timelines, phases = [], []
    for info in batches:
        if info.record.batch_id not in oldest:
            continue  # the warm-up's, or empty
        run = by_run.get(info.record.run_id)
        tis, events = details.get(info.record.run_id, ([], []))
        marks = {"oldest_record": oldest[info.record.batch_id] / 1000, "planned": info.created_at.timestamp(),
                 "committed": info.committed_at.timestamp()}
        if events:
            marks["event"] = min(from_iso(e["timestamp"]).timestamp() for e in events)
        if run and run.get("start_date"):
            marks["run_started"] = from_iso(run["start_date"]).timestamp()
        for mark, field in (("task_queued", "queued_when"), ("task_started", "start_date")):
            moments = [from_iso(ti[field]).timestamp() for ti in tis if ti.get(field)]
            if moments:
                marks[mark] = min(moments)  # its first try
        timelines.append(marks)
        summary = info.record.summary
        if summary is not None:
            seconds = dict(summary.seconds)
            job = sum(v for k, v in seconds.items() if k not in PROTOCOL_PHASES)  # the engine's Spark jobs
            if "execute" in seconds:
                seconds["spark_session_and_setup"] = round(seconds["execute"] - job, 3)
            phases.append(seconds)

    ids = {e["event_id"] for e in produced}
    import pymysql

    conn = pymysql.connect(**mysql)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT event_id FROM {page_views.ON_ARRIVAL}")
            in_sink = {row[0] for row in cur.fetchall()} & ids
    finally:
        conn.close()
    failed_runs = [r["dag_run_id"] for r in runs if r["state"] != "success"]
    empty = [b.record.batch_id for b in batches if all(r.size == 0 for r in b.record.ranges)]
    figures: dict[str, Any] = {
        "spark_conn_id": args.spark_conn_id, "bursts": args.bursts, "records_per_burst": args.records,
        "gaps_s": [low, high], "records": len(measured),
        "warmup_runs": warmup_runs, "runs": len(runs), "run_types": sorted({r["run_type"] for r in runs}),
        "failed_runs": failed_runs,
        "batches": len(batches), "empty_batches": len(empty),
        "events_per_run": [len(details[r["dag_run_id"]][1]) for r in runs],
        "runs_in_quiet_period": len(runs) - runs_at_rest, "missing_in_sink": len(ids - in_sink),
        "latency_s": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                      "max": max(latencies)} if latencies else {},
        "segments_median_s": {}, "phases_median_s": {}, "elapsed_s": round(elapsed, 1),
        "timelines_s": [{k: round(v - t["oldest_record"], 2) for k, v in sorted(t.items(), key=lambda kv: kv[1])}
                        for t in timelines],
        "produced_at": datetime.now(timezone.utc).isoformat(),
    }
    for name, start, end in SEGMENTS:
        spans = [t[end] - t[start] for t in timelines if start in t and end in t]
        if spans:
            figures["segments_median_s"][name] = round(statistics.median(spans), 2)
    for phase in sorted({k for p in phases for k in p}):
        figures["phases_median_s"][phase] = round(statistics.median(p[phase] for p in phases if phase in p), 2)

    ok = (not failed_runs and figures["runs_in_quiet_period"] == 0 and figures["missing_in_sink"] == 0
          and len(measured) == args.bursts * args.records and len(latencies) == len(measured))
    figures["ok"] = ok
    lat = figures["latency_s"]
    print(f"latency: {len(measured)} records in {args.bursts} bursts, {len(runs)} runs ({len(empty)} empty "
          f"batches), produce-to-visible p50={lat.get('p50', 0):.1f}s p95={lat.get('p95', 0):.1f}s "
          f"max={lat.get('max', 0):.1f}s")
    for name, seconds in figures["segments_median_s"].items():
        print(f"latency:   {seconds:6.2f} s  {name}")
    print("latency: inside the batch (median s): " + ", ".join(f"{k}={v}" for k, v in
                                                                figures["phases_median_s"].items()))
    print(f"latency: every event in the sink once: {figures['missing_in_sink'] == 0}; failed runs: {failed_runs}; "
          f"runs in the {args.quiet:.0f} s quiet period: {figures['runs_in_quiet_period']}; ok={ok}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
