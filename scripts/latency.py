"""Produce-to-visible latency of event-driven runs (``dags/page_view_events_on_arrival.py``) under a real Airflow,
beside the same pipeline on a clock and behind a sensor.

    make up && . .stack/env && .venv/bin/python scripts/latency.py [--modes event,continuous,cron,sensor]
        [--bursts 20 --records 1000 --gaps 5,30] [--faults]

A throwaway Airflow deployment on loopback (``tests/scheduler/airflow_services.py``: api-server, scheduler,
dag-processor and triggerer, LocalExecutor, PostgreSQL metadata database) runs the example DAG, pointed at a fresh
topic and pipeline id per mode (the file's names replaced; for the other modes, its schedule too):

- ``event``: the example as it is: ``EoBacklogTrigger`` fires an asset event (1,000 records, or the oldest 10 s old);
- ``continuous``: ``schedule="@continuous"``, a run after the other, each taking what arrived (empty ones too);
- ``cron``: ``schedule="* * * * *"``, a run every minute;
- ``sensor``: ``@continuous`` runs whose first task is a deferrable ``KafkaBacklogSensor`` with the trigger's
  thresholds (the triggerer polls every second), then the batch.

The modes run one after the other (each DAG paused when measured). After one warm-up burst (not counted: the first
run also finds the watcher starting), ``--bursts`` bursts of ``--records`` page views are produced at random gaps
(uniform in ``--gaps`` seconds). Once every record is committed, a quiet period follows: an event-driven DAG may
start no run in it (nothing new arrived); the others' runs in it are counted (runs with nothing to do).

Latency of a record = its batch's commit time in the offset store (``eo_batch.committed_at``) minus the record's
Kafka timestamp (the producer's CreateTime); p50 / p95 / max over every record of the bursts. Where the time goes,
per batch from its oldest record (medians): until the trigger's asset event (poll, threshold, or held while the
run before it was running) or, in the other modes, until the batch's task was queued (the next tick, the next
continuous run, the sensor's poll); until the task started, until the batch was planned (the task's start-up:
imports, take, recover, plan), until it committed (Spark's start, the batch, the commit; the summary's phases). It
checks, and says, that every produced event is in the sink once and that every run succeeded; the exit status is
non-zero otherwise.

``--faults`` (event mode; its DAG's backlog gets a second watcher, which one poll must serve with the first) then:
SIGKILLs the triggerer while its watcher waits on a backlog below the threshold and
starts it again (one run must commit the backlog); and cuts the offset store off from Airflow (the deployment's
``eo_offset_store`` connection goes through a :class:`~tests.support.tcp_gate.TcpGate`) while records arrive: no
event while the store does not answer, then one run when it does.

``--short`` (event mode, 2 bursts of 200 records, gaps of 2 to 6 s, a 10 s quiet period) with ``--faults`` is
what ``tests/scheduler/test_event_driven_runs.py`` runs so that this script cannot rot.
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
from dataclasses import dataclass
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
from tests.support.tcp_gate import TcpGate  # noqa: E402

EXAMPLE = REPO / "dags" / "page_view_events_on_arrival.py"
BATCH_TASK = "store_page_view_events"
MODES = ("event", "continuous", "cron", "sensor")
SEGMENTS = (  # (name, from, to, in which modes): the timeline of one batch, from its oldest record
    ("trigger fired (poll, threshold, triggerer; or held while the run before ran)", "oldest_record", "event",
     "event"),
    ("scheduler created and started the run", "event", "run_started", "event"),
    ("scheduler queued the task to the executor", "run_started", "task_queued", "event"),
    ("waited for the schedule (the next tick or continuous run, the sensor's poll)", "oldest_record", "task_queued",
     "others"),
    ("executor started the task's process", "task_queued", "task_started", "all"),
    ("task planned the batch (DAG file parsed, operator set up, take, recover, plan)", "task_started", "planned",
     "all"),
    ("batch committed (Spark session + batch + commit)", "planned", "committed", "all"),
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


#: A second watcher of the event DAG's backlog (``--faults``): the same looks (so one poll serves both in the
#: triggerer), a threshold it never reaches during the test.
SECOND_WATCHER = ("AssetWatcher(name=f'{PIPELINE}.backlog.daily', trigger=EoBacklogTrigger(PIPELINE, [%r], "
                  "min_records=10**9, max_delay=timedelta(days=1), poll_interval=1.0, kafka_conn_id='kafka_default', "
                  "offset_store_conn_id='eo_offset_store'))")


def mode_dag(mode: str, pipeline_id: str, topic: str, spark_conn_id: str = "", second_watcher: bool = False) -> str:
    """The example DAG for ``mode`` (:data:`MODES`): its schedule replaced, and a sensor before the batch; or, in
    event mode with ``second_watcher``, a second watcher of its backlog (:data:`SECOND_WATCHER`)."""
    text = example_dag(pipeline_id, topic, spark_conn_id)
    if mode == "event":
        end = 'kafka_conn_id="kafka_default", offset_store_conn_id="eo_offset_store"))],'
        if second_watcher:
            if text.count(end) != 1:
                raise SystemExit(f"{EXAMPLE} changed: expected {end!r} once; update scripts/latency.py")
            text = text.replace(end, end[:-2] + ", " + SECOND_WATCHER % topic + "],")
        return text
    edits = [("schedule=[backlog],", f"schedule={'@continuous' if mode != 'cron' else '* * * * *'!r},", 1)]
    if mode == "sensor":
        edits += [("from airflow_eo.operators import KafkaMicroBatchOperator\n",
                   "from airflow_eo.operators import KafkaMicroBatchOperator\n"
                   "from airflow_eo.sensors import KafkaBacklogSensor\n", 1),
                  ("    KafkaMicroBatchOperator(\n",
                   f"    KafkaBacklogSensor(task_id='wait_for_backlog', pipeline_id=PIPELINE, topics=[{topic!r}], "
                   "min_records=1_000, min_age=timedelta(seconds=10), deferrable=True, poll_interval=1.0, "
                   "kafka_conn_id='kafka_default', offset_store_conn_id='eo_offset_store', retries=2, "
                   "retry_delay=timedelta(seconds=1)) >> "
                   "KafkaMicroBatchOperator(\n", 1)]
    for old, new, count in edits:
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


def batch_of(batches: Iterable[Any], partition: int, offset: int, topic: str) -> Any:
    for info in batches:
        if any(r.topic == topic and r.partition == partition and r.from_offset <= offset < r.until_offset
               for r in info.record.ranges):
            return info
    return None


@dataclass
class Clients:
    """What the script reads and writes with, outside the deployment (the store directly, not through a gate)."""

    bootstrap: str
    mysql: dict[str, Any]
    store: Any
    source: KafkaOffsetSource

    def all_committed(self, pipeline_id: str, topic: str) -> bool:
        ends = self.source.last_stable(self.source.partitions([topic]))
        committed = self.store.committed_offsets(pipeline_id)
        return all(committed.get(k, 0) >= end for k, end in ends.items())

    def missing_in_sink(self, events: Iterable[dict[str, Any]]) -> int:
        import pymysql

        ids = {e["event_id"] for e in events}
        conn = pymysql.connect(**self.mysql)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT event_id FROM {page_views.ON_ARRIVAL}")
                return len(ids - {row[0] for row in cur.fetchall()})
        finally:
            conn.close()


def measure(mode: str, airflow: AirflowServices, dag_id: str, topic: str, clients: Clients,
            args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """Warm-up, the bursts, the quiet period of one mode's DAG; its figures."""
    low, high = (float(x) for x in args.gaps.split(","))
    started = time.monotonic()
    airflow.wait_for_dag(dag_id, timeout=180)
    airflow.unpause(dag_id)
    # Warm-up: the watcher starts in the triggerer, the first run makes its JVM's caches; not counted.
    page_views.produce_page_views(clients.bootstrap, args.records, topic)
    wait(lambda: clients.all_committed(dag_id, topic), 600, "the warm-up burst's commit", airflow, dag_id)
    warm_ends = clients.source.last_stable(clients.source.partitions([topic]))
    warmup_runs = len(airflow.dag_runs(dag_id))
    print(f"latency[{mode}]: warm-up committed by {warmup_runs} run(s), {time.monotonic() - started:.0f} s in",
          flush=True)

    produced: list[dict[str, Any]] = []
    for burst in range(args.bursts):
        produced += page_views.produce_page_views(clients.bootstrap, args.records, topic)
        if burst < args.bursts - 1:
            time.sleep(rng.uniform(low, high))
    wait(lambda: clients.all_committed(dag_id, topic), 900, "every burst's commit", airflow, dag_id)
    runs_at_rest = len(airflow.dag_runs(dag_id))
    time.sleep(args.quiet)
    runs = airflow.dag_runs(dag_id)
    if mode != "event" or not args.faults:
        airflow.pause(dag_id)
    details = {run["dag_run_id"]: (airflow.task_instances(dag_id, run["dag_run_id"]),
                                   airflow.upstream_asset_events(dag_id, run["dag_run_id"])) for run in runs}
    elapsed = time.monotonic() - started

    batches = [b for b in clients.store.batch_history(dag_id, limit=10_000) if b.committed_at is not None]
    records, _ = read_records(clients.bootstrap, topic)
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
        tis = [ti for ti in tis if ti["task_id"] == BATCH_TASK]
        marks = {"oldest_record": oldest[info.record.batch_id] / 1000, "planned": info.created_at.timestamp(),
                 "committed": info.committed_at.timestamp()}
        if events:
            marks["event"] = min(from_iso(e["timestamp"]).timestamp() for e in events)
        if run and run.get("start_date") and mode == "event":
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

    failed_runs = [r["dag_run_id"] for r in runs if r["state"] not in ("success", "running", "queued")]
    empty = [b.record.batch_id for b in batches if all(r.size == 0 for r in b.record.ranges)]
    figures: dict[str, Any] = {
        "mode": mode, "dag_id": dag_id, "spark_conn_id": args.spark_conn_id, "bursts": args.bursts,
        "records_per_burst": args.records, "gaps_s": [low, high], "records": len(measured),
        "warmup_runs": warmup_runs, "runs": len(runs), "run_types": sorted({r["run_type"] for r in runs}),
        "failed_runs": failed_runs,
        "batches": len(batches), "empty_batches": len(empty),
        "events_per_run": [len(details[r["dag_run_id"]][1]) for r in runs],
        "runs_in_quiet_period": len(runs) - runs_at_rest, "missing_in_sink": clients.missing_in_sink(produced),
        "latency_s": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                      "max": max(latencies)} if latencies else {},
        "segments_median_s": {}, "phases_median_s": {}, "elapsed_s": round(elapsed, 1),
        "timelines_s": [{k: round(v - t["oldest_record"], 2) for k, v in sorted(t.items(), key=lambda kv: kv[1])}
                        for t in timelines],
        "produced_at": datetime.now(timezone.utc).isoformat(),
    }
    for name, start, end, modes in SEGMENTS:
        spans = [t[end] - t[start] for t in timelines if start in t and end in t]
        if spans and modes in ("all", "event" if mode == "event" else "others"):
            figures["segments_median_s"][name] = round(statistics.median(spans), 2)
    for phase in sorted({k for p in phases for k in p}):
        figures["phases_median_s"][phase] = round(statistics.median(p[phase] for p in phases if phase in p), 2)

    figures["ok"] = (not failed_runs and figures["missing_in_sink"] == 0
                     and (mode != "event" or figures["runs_in_quiet_period"] == 0)
                     and len(measured) == args.bursts * args.records and len(latencies) == len(measured))
    lat = figures["latency_s"]
    print(f"latency[{mode}]: {len(measured)} records in {args.bursts} bursts, {len(runs)} runs ({len(empty)} empty "
          f"batches), produce-to-visible p50={lat.get('p50', 0):.1f}s p95={lat.get('p95', 0):.1f}s "
          f"max={lat.get('max', 0):.1f}s")
    for name, seconds in figures["segments_median_s"].items():
        print(f"latency[{mode}]:   {seconds:6.2f} s  {name}")
    print(f"latency[{mode}]: inside the batch (median s): " + ", ".join(f"{k}={v}" for k, v in
                                                                      figures["phases_median_s"].items()))
    print(f"latency[{mode}]: every event in the sink once: {figures['missing_in_sink'] == 0}; failed runs: "
          f"{failed_runs}; runs in the {args.quiet:.0f} s quiet period: {figures['runs_in_quiet_period']}; "
          f"ok={figures['ok']}", flush=True)
    return figures


def faults(airflow: AirflowServices, gate: TcpGate, dag_id: str, topic: str, clients: Clients) -> dict[str, Any]:
    """The event-driven DAG through a triggerer SIGKILLed while its watcher waits, and through a store that does not
    answer for a while: each backlog is committed by exactly one run, and no event comes while the store is away."""
    found: dict[str, Any] = {}
    few = 200  # under the trigger's 1,000 records: it waits for the oldest to be 10 s old

    def polls() -> int:  # the shared streams the triggerer opened for this pipeline (EoBacklogTrigger logs each)
        return airflow.service_log("triggerer").read_text(errors="replace").count(
            f"pipeline {dag_id}: looking at its backlog every")

    found["polls_for_two_watchers"] = polls()  # the DAG's backlog has two watchers (SECOND_WATCHER)
    runs_before = len(airflow.dag_runs(dag_id))
    produced = page_views.produce_page_views(clients.bootstrap, few, topic)
    began = time.monotonic()
    airflow.kill_and_restart("triggerer")
    wait(lambda: clients.all_committed(dag_id, topic), 300, "the backlog's commit after the triggerer's restart",
         airflow, dag_id)
    airflow.wait_for_runs(dag_id, count=len(airflow.dag_runs(dag_id)), timeout=120)
    found["triggerer_restart"] = {"runs": len(airflow.dag_runs(dag_id)) - runs_before,
                                  "missing_in_sink": clients.missing_in_sink(produced),
                                  "committed_after_s": round(time.monotonic() - began, 1)}
    print(f"latency[faults]: triggerer SIGKILLed mid-wait: {found['triggerer_restart']}", flush=True)

    runs_before = len(airflow.dag_runs(dag_id))
    log_size = airflow.service_log("triggerer").stat().st_size
    gate.close()
    produced = page_views.produce_page_views(clients.bootstrap, few, topic)
    time.sleep(25)  # past the trigger's 10 s max_delay: it would have fired, had it seen the store
    runs_while_away = len(airflow.dag_runs(dag_id)) - runs_before
    with open(airflow.service_log("triggerer"), "rb") as log:
        log.seek(log_size)
        warned = b"did not answer" in log.read()
    gate.open()
    began = time.monotonic()
    wait(lambda: clients.all_committed(dag_id, topic), 300, "the backlog's commit after the store answered again",
         airflow, dag_id)
    airflow.wait_for_runs(dag_id, count=len(airflow.dag_runs(dag_id)), timeout=120)
    found["store_away"] = {"runs_while_away": runs_while_away, "triggerer_warned": warned,
                           "runs": len(airflow.dag_runs(dag_id)) - runs_before,
                           "missing_in_sink": clients.missing_in_sink(produced),
                           "committed_after_s": round(time.monotonic() - began, 1)}
    print(f"latency[faults]: store away 25 s: {found['store_away']}", flush=True)
    failed = [r["dag_run_id"] for r in airflow.dag_runs(dag_id) if r["state"] != "success"]
    found["failed_runs"] = failed
    found["polls_after_the_restart"] = polls() - found["polls_for_two_watchers"]
    print(f"latency[faults]: polls opened for the two watchers: {found['polls_for_two_watchers']}, and after the "
          f"triggerer's restart: {found['polls_after_the_restart']}", flush=True)
    found["ok"] = (found["triggerer_restart"]["runs"] == 1 == found["store_away"]["runs"]
                   and found["polls_for_two_watchers"] == 1 == found["polls_after_the_restart"]
                   and runs_while_away == 0 and warned and not failed
                   and found["triggerer_restart"]["missing_in_sink"] == 0 == found["store_away"]["missing_in_sink"])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="event", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--records", type=int, default=1000, help="records per burst")
    parser.add_argument("--gaps", default="5,30", help="min,max seconds between two bursts (uniform)")
    parser.add_argument("--quiet", type=float, default=30.0, help="seconds after the last commit with no new run")
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--short", action="store_true", help="2 bursts of 200 records, gaps 2-6 s, 10 s quiet")
    parser.add_argument("--faults", action="store_true", help="then kill the triggerer, and cut the store off")
    parser.add_argument("--spark-conn-id", default="", help="where the runs' Spark runs (a spark or spark_connect "
                        "connection in the environment, e.g. spark_connect of `make spark-cluster`); default: "
                        "local[*] in the task")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--keep", help="keep the deployment's AIRFLOW_HOME and logs in this folder")
    args = parser.parse_args(argv)
    if args.short:
        args.bursts, args.records, args.gaps, args.quiet = 2, 200, "2,6", 10.0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES) or (args.faults and "event" not in modes):
        parser.error(f"--modes: some of {', '.join(MODES)} (--faults needs event)")
    rng = random.Random(args.seed)
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    mysql = EoMySqlHook("mysql_default").get_connect_kwargs()
    page_views.ensure_tables(mysql)
    clients = Clients(bootstrap, mysql, OffsetStoreHook().get_store(),
                      KafkaOffsetSource({"bootstrap.servers": bootstrap}))

    suffix = uuid.uuid4().hex[:8]
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="latency-"))
    dags = base / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    names = {mode: (f"latency_{mode}_{suffix}", f"latency_{mode}_{suffix}") for mode in modes}  # (DAG id, topic)
    for mode, (dag_id, topic) in names.items():
        page_views.ensure_topic(bootstrap, topic)
        (dags / f"{dag_id}.py").write_text(mode_dag(mode, dag_id, topic, args.spark_conn_id, args.faults))
    env = {k: v for k, v in os.environ.items() if k.startswith(("AIRFLOW_CONN_", "EO_SPARK_"))}
    gate = None
    if args.faults:  # the deployment reaches the store through a gate the script can close
        gate = TcpGate((mysql["host"], int(mysql["port"])))
        store_conn = OffsetStoreHook().get_connection(OffsetStoreHook.default_conn_name)
        env["AIRFLOW_CONN_EO_OFFSET_STORE"] = store_conn.get_uri().replace(
            f"{store_conn.host}:{store_conn.port}", f"127.0.0.1:{gate.port}", 1)
    figures: dict[str, Any] = {"modes": {}}
    with AirflowServices(dags, env=env, base_dir=base / "airflow", triggerer=True) as airflow:
        print(f"latency: deployment up in {airflow.timings.get('start_total_s', 0):.0f} s; "
              f"modes {', '.join(modes)}", flush=True)
        for mode, (dag_id, topic) in names.items():
            figures["modes"][mode] = measure(mode, airflow, dag_id, topic, clients, args, rng)
        if gate is not None:
            figures["faults"] = faults(airflow, gate, *names["event"], clients)
    if gate is not None:
        gate.close()
    if len(modes) > 1:
        print("latency: side by side (s)          p50     p95     max   runs  empty batches  runs with nothing new")
        for mode, f in figures["modes"].items():
            lat = f["latency_s"]
            print(f"latency:   {mode:<24} {lat.get('p50', 0):7.1f} {lat.get('p95', 0):7.1f} {lat.get('max', 0):7.1f} "
                  f"{f['runs']:6d} {f['empty_batches']:14d} {f['runs_in_quiet_period']:21d}")
    figures["ok"] = all(f["ok"] for f in figures["modes"].values()) and figures.get("faults", {}).get("ok", True)
    if len(modes) == 1:  # one mode: its figures at the top level, as before
        figures = {**figures.pop("modes")[modes[0]], **figures, "ok": figures["ok"]}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
