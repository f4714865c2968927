"""The cost of breadth: a topic of a thousand partitions against one of three, and twenty pipelines on one offset
store, their batches four at a time, against a pipeline alone.

    make up && . .stack/env && .venv/bin/python scripts/breadth.py --json breadth.json   # 1,000,000 records
    .venv/bin/python scripts/breadth.py --short                                          # the suite's setting

**Wide.** N page views spread evenly over a topic of ``--partitions`` partitions (a few records each), and the
same N over a topic of three; one batch of the XA sink over each, each in a process of its own (the driver's peak
memory is that batch's; a small batch first, not measured, pays the JVM's warm-up). Printed per topic: the batch's
seconds, its protocol (planning, the store's commit, finalize, and the consumer-group mirror the operator runs after
the commit) and its share of the batch, the driver's peak resident memory (Python and JVM). Targets: protocol share
≤ 5% and driver peak within 1.5x of the three-partition batch.

**Many.** ``--pipelines`` pipelines on the default offset store, each over a three-partition topic of its own
(``--pipeline-records`` page views) into a table of its own, their batches ``--at-a-time`` at once: as many driver
processes as an Airflow worker's tasks would be, each running its share one after the other, started together once
every driver is warm; before them, one driver runs ``--at-a-time`` pipelines alone, one after the other. Printed:
the median and the largest protocol time of a batch in each setting (and the median of the driver process's CPU
seconds in it: its own work, the rest is waiting), and the store's row-lock waits and deadlocks
meanwhile (MariaDB's ``Innodb_row_lock_waits``,
``Innodb_row_lock_time``, ``Innodb_deadlocks``; the stack's MariaDB serves nothing else while it runs), the server's
statements per batch, each protocol call's seconds (:class:`CallSeconds`), and what the load did to a round trip
meanwhile (:class:`RoundTrips`: a ``SELECT 1`` and a one-row committed write to the store and a metadata request to
the broker, from the idle parent process). Target: the median within 1.5x of the
pipelines alone. ``--jvm-nice N`` runs the drivers' Spark JVMs at nice N in both settings: what is left of the
slowdown is then not Spark's compute taking the cores the protocol waits for.

Every batch's output is checked (rows in its table, offsets committed) before its time counts. Topics and tables
are deleted at the end. Numbers, not assertions: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # airflow's own dependency

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark's package (bench/)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # examples/: the page views' producer

from bench.common import (
    DriverMemory,
    drop_made_tables,
    engine,
    expect,
    fresh_table,
    mysql_kwargs,
    spark_hook,
    sql,
    table_rows,
)

from airflow_eo.core.batch import RunRequest
from airflow_eo.core.protocol import run_batch
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import OffsetStoreHook
from airflow_eo.sinks import MySqlXaSink
from examples import page_views
from examples.topics import delete_topics, ensure_topic

SCRIPT = Path(__file__).resolve()
#: the protocol's phases of a batch (core/protocol.py's seconds), and the mirror the operator adds after it
PROTOCOL = ("plan", "commit", "finalize", "group_mirror")
LOCK_STATUS = ("Innodb_row_lock_waits", "Innodb_row_lock_time", "Innodb_deadlocks")
#: the server's count of statements (every client's: the stack's MariaDB serves nothing else while the part runs)
STATEMENTS = "Questions"


def produce_spread(topic: str, partitions: int, records: int) -> None:
    """``records`` page views, partition i % ``partitions`` for the i-th: every partition gets its share."""
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    ensure_topic(bootstrap, topic, partitions)
    page_views.produce_page_views(bootstrap, records, topic=topic, kept=0.0, spread_over=partitions)


class CpuOutsideExecute:
    """The engine, counting the driver process's CPU seconds spent in its ``execute`` (the rest of a batch's is the
    protocol's: where a slower protocol's time went, the driver's own work or waiting)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.cpu_s = inner, 0.0

    def check(self) -> None:
        self.inner.check()

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return self.inner.execute(*args, **kwargs)
        finally:
            self.cpu_s += time.process_time() - started


class CallSeconds:
    """One of the protocol's collaborators (the store, the offset source, the sink), adding each of its calls' wall
    seconds to ``into`` under ``<label>.<method>``: which of the protocol's round trips a busier machine slowed."""

    def __init__(self, inner: Any, label: str, into: dict[str, float]) -> None:
        self._inner, self._label, self._into = inner, label, into

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if name.startswith("_") or not callable(found):
            return found

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return found(*args, **kwargs)
            finally:
                key = f"{self._label}.{name}"
                self._into[key] = self._into.get(key, 0.0) + time.monotonic() - started

        return timed


def one_batch(pipeline_id: str, topic: str, records: int, parallelism: int) -> dict[str, Any]:
    """One batch of the XA sink over the whole topic into a fresh table, with the consumer-group mirror after it;
    its output checked; its seconds by phase and by call of the store, the offset source and the sink
    (:class:`CallSeconds`), and the driver's CPU seconds in its protocol."""
    table = fresh_table("page_view_events", "breadth")
    kafka, store = KafkaClusterHook("kafka_default"), OffsetStoreHook().get_store()
    spark, source = CpuOutsideExecute(engine(parallelism)), kafka.get_offset_source()
    sink = build_sink(MySqlXaSink(table=table, key_columns=["event_id"]), pipeline_id)
    calls: dict[str, float] = {}
    started, cpu = time.monotonic(), time.process_time()
    summary = run_batch(RunRequest(pipeline_id=pipeline_id, run_id="breadth", topics=[topic]),
                        store=CallSeconds(store, "store", calls), source=CallSeconds(source, "source", calls),
                        engine=spark, sink=CallSeconds(sink, "sink", calls))
    committed = time.monotonic()
    offsets = store.committed_offsets(pipeline_id)
    source.mirror_group_offsets(pipeline_id, offsets)
    seconds = time.monotonic() - started
    protocol_cpu = time.process_time() - cpu - spark.cpu_s
    phases = {**summary.seconds, "group_mirror": round(time.monotonic() - committed, 3)}
    expect(f"{pipeline_id}: records in, rows in its table", (summary.records_in, table_rows(table)),
           (records, records))
    expect(f"{pipeline_id}: records under the committed offsets", sum(offsets.values()), records)
    protocol = sum(phases.get(phase, 0.0) for phase in PROTOCOL)
    return {"pipeline": pipeline_id, "seconds": round(seconds, 3), "protocol_s": round(protocol, 3),
            "protocol_cpu_s": round(protocol_cpu, 4), "protocol_share": protocol / seconds, "phases": phases,
            "calls": {name: round(s, 4) for name, s in calls.items() if name != "sink.write"}}


def wide_batch_in_this_process(topic: str, partitions: int, records: int, parallelism: int) -> dict[str, Any]:
    """The wide part's batch over ``topic``, after a small batch of the same width that pays the JVM's warm-up."""
    spark = spark_hook().get_conn()
    memory = DriverMemory(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    warm = f"breadth_warm_{uuid.uuid4().hex[:8]}"
    produce_spread(warm, partitions, min(records, partitions * 5))
    try:
        one_batch(f"breadth_{warm}", warm, min(records, partitions * 5), parallelism)
        drop_made_tables()
        memory.reset()
        found = one_batch(f"breadth_{topic}", topic, records, parallelism)
        found["driver_peak_rss_mb"] = memory.peak_mb()
    finally:
        drop_made_tables()
        delete_topics(os.environ["EO_KAFKA_BOOTSTRAP"], [warm])
    return {"partitions": partitions, "records": records, **found}


def wide(records: int, partitions: int, parallelism: int) -> list[dict[str, Any]]:
    results = []
    for width in (3, partitions):
        topic = f"breadth_{width}p_{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        produce_spread(topic, width, records)
        print(f"[wide] {records:,} page views over {width:,} partitions of {topic} in "
              f"{time.monotonic() - started:.1f}s", flush=True)
        try:
            child = subprocess.run([sys.executable, str(SCRIPT), "--wide-batch",
                                    f"{topic}:{width}:{records}:{parallelism}"], stdout=subprocess.PIPE, text=True)
        finally:
            delete_topics(os.environ["EO_KAFKA_BOOTSTRAP"], [topic])
        lines = child.stdout.splitlines()
        if child.returncode != 0 or not any(line.startswith("WIDE ") for line in lines):
            sys.exit(f"the batch over {width} partitions failed (exit {child.returncode}): {child.stdout[-3000:]}")
        results.append(json.loads(next(line for line in lines if line.startswith("WIDE "))[5:]))
    narrow, broad = results
    for result in results:
        memory = result["driver_peak_rss_mb"]
        print(f"[wide] {result['partitions']:>5,} partitions: batch {result['seconds']:.2f}s, protocol "
              f"{result['protocol_s']:.3f}s ({result['protocol_share']:.1%}: "
              + ", ".join(f"{p} {result['phases'].get(p, 0.0):.3f}s" for p in PROTOCOL)
              + f"), driver peak {memory['python']} MiB Python, {memory['jvm']} MiB JVM; every phase: "
              + ", ".join(f"{p} {s:.2f}s" for p, s in result["phases"].items()), flush=True)
    memory_ratio = {k: broad["driver_peak_rss_mb"][k] / narrow["driver_peak_rss_mb"][k] for k in ("python", "jvm")}
    print(f"[wide] {partitions:,} against 3 partitions: protocol share {broad['protocol_share']:.1%} (target <= 5%), "
          f"driver peak x{memory_ratio['python']:.2f} Python, x{memory_ratio['jvm']:.2f} JVM (target <= 1.5), "
          f"batch x{broad['seconds'] / narrow['seconds']:.2f}", flush=True)
    for result in results:
        result["memory_ratio_to_3_partitions"] = memory_ratio if result is broad else None
    return results


#: a row-lock wait longer than this is recorded with what held the lock (InnoDB gives up at the stack's 20 s)
LONG_WAIT_S = 2

#: every row-lock wait now going on: the waiting statement, the lock, and the transaction holding it
LOCK_WAITS = (
    "SELECT r.trx_id AS waiting_trx, TIMESTAMPDIFF(SECOND, r.trx_wait_started, NOW()) AS waited_s, "
    "r.trx_query AS waiting_query, b.trx_id AS holding_trx, b.trx_state AS holding_state, "
    "b.trx_started AS holding_since, b.trx_mysql_thread_id AS holding_thread, b.trx_query AS holding_query, "
    "p.command AS holding_command, p.info AS holding_info, l.lock_mode, l.lock_type, l.lock_table, l.lock_index, "
    "l.lock_data "
    "FROM information_schema.INNODB_LOCK_WAITS w "
    "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
    "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id "
    "JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.blocking_lock_id "
    "LEFT JOIN information_schema.PROCESSLIST p ON p.id = b.trx_mysql_thread_id")


class LongLockWaits:
    """Row-lock waits longer than :data:`LONG_WAIT_S` while the pipelines run, with the transaction that held the
    lock (read every half second on a connection of its own): what a batch that timed out waited for."""

    def __init__(self) -> None:
        import pymysql

        from airflow_eo.mysql.connection import connect as mysql_connect

        self.found: dict[tuple[str, str], dict[str, Any]] = {}
        self.statements = 0  # its own, on the server the part counts statements of
        self._conn = mysql_connect(mysql_kwargs(), autocommit=True, cursorclass=pymysql.cursors.DictCursor)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with self._conn.cursor() as cur:
                cur.execute(LOCK_WAITS)
                self.statements += 1
                for row in cur.fetchall():
                    if (row["waited_s"] or 0) >= LONG_WAIT_S:
                        self.found[(str(row["waiting_trx"]), str(row["holding_trx"]))] = {
                            k: str(v) if v is not None else None for k, v in row.items()}

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        self._conn.close()
        for wait in self.found.values():
            print(f"[many] a row-lock wait of {wait['waited_s']}s or more: {wait['waiting_query']!r} waited for "
                  f"{wait['lock_mode']} {wait['lock_type']} lock on {wait['lock_table']} {wait['lock_index']} "
                  f"({wait['lock_data']}) held by transaction {wait['holding_trx']} ({wait['holding_state']} since "
                  f"{wait['holding_since']}, thread {wait['holding_thread']}: {wait['holding_command']}, "
                  f"{wait['holding_query'] or wait['holding_info']!r})", flush=True)
        return list(self.found.values())


class RoundTrips:
    """What the machine's load does to a round trip, whatever the protocol asks: every :data:`PROBE_EVERY_S`, the
    time of a ``SELECT 1`` and of a one-row committed write (its redo log flushed, as every store transaction's is)
    on a store connection of its own, and of a metadata request of one topic to the broker (the planning's kind of
    request), from this process (idle meanwhile, as a driver between its Spark jobs is). A protocol that slows down
    as much as these did waited for the machine, not for other pipelines."""

    def __init__(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient

        from airflow_eo.mysql.connection import connect as mysql_connect

        self.store_s: list[float] = []
        self.commit_s: list[float] = []
        self.kafka_s: list[float] = []
        self._table = f"bench_breadth_probe_{uuid.uuid4().hex[:8]}"
        self.statements = 2  # its own, on the server the part counts statements of: the table's CREATE and DROP
        self._topic = topic
        self._conn = mysql_connect(mysql_kwargs(), autocommit=True)
        with self._conn.cursor() as cur:
            cur.execute(f"CREATE TABLE `{self._table}` (id INT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB")
        self._admin = AdminClient({"bootstrap.servers": os.environ["EO_KAFKA_BOOTSTRAP"]})
        self._admin.list_topics(topic=topic, timeout=10)  # the broker's connection up before any round trip counts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, daemon=True)
        self._thread.start()

    def _probe(self) -> None:
        while not self._stop.wait(PROBE_EVERY_S):
            started = time.perf_counter()
            with self._conn.cursor() as cur:
                cur.execute("SELECT 1")
                cur.fetchall()
                selected = time.perf_counter()
                cur.execute(f"INSERT INTO `{self._table}` VALUES (1, 0) ON DUPLICATE KEY UPDATE n = n + 1")
            asked = time.perf_counter()
            self._admin.list_topics(topic=self._topic, timeout=10)
            self.statements += 2
            self.store_s.append(selected - started)
            self.commit_s.append(asked - selected)
            self.kafka_s.append(time.perf_counter() - asked)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        try:
            with self._conn.cursor() as cur:
                cur.execute(f"DROP TABLE `{self._table}`")
        finally:
            self._conn.close()
        return {"store_median_s": statistics.median(self.store_s or [0.0]),
                "commit_median_s": statistics.median(self.commit_s or [0.0]),
                "kafka_median_s": statistics.median(self.kafka_s or [0.0]), "probes": len(self.store_s)}


#: how often :class:`RoundTrips` times its three round trips
PROBE_EVERY_S = 0.02


def lock_status() -> dict[str, int]:
    rows = sql("SHOW GLOBAL STATUS WHERE Variable_name IN (%s, %s, %s, %s)", (*LOCK_STATUS, STATEMENTS))
    return {name: int(value) for name, value in rows}


def batches(drivers: list[list[str]], records: int, parallelism: int, workdir: Path, jvm_nice: int) -> dict[str, Any]:
    """Each of ``drivers`` (a warm-up topic, then its measured topics) in a driver process of its own, as an Airflow
    worker's task would run, their measured batches started together once every driver is warm; their protocol
    times and the store's lock waits meanwhile."""
    go = workdir / f"go_{uuid.uuid4().hex[:8]}"
    errors = [workdir / f"{go.name}.stderr.{i}" for i in range(len(drivers))]  # a failed driver's says why
    children = []
    for topics, error in zip(drivers, errors, strict=True):
        with error.open("w") as stderr:
            children.append(subprocess.Popen([sys.executable, str(SCRIPT), "--driver-batches",
                                              f"{go}:{records}:{parallelism}:{jvm_nice}:{','.join(topics)}"],
                                             stdout=subprocess.PIPE, stderr=stderr, text=True))

    def failed(child: subprocess.Popen, error: Path, when: str) -> None:
        sys.exit(f"a driver of the many part failed {when} (exit {child.returncode}); its error output ends with:\n"
                 + error.read_text()[-6000:])

    deadline = time.monotonic() + 600
    while len(list(workdir.glob(f"{go.name}.ready.*"))) < len(drivers):
        if time.monotonic() > deadline or any(child.poll() not in (None, 0) for child in children):
            for child in children:
                child.kill()
            culprit = next(((c, e) for c, e in zip(children, errors, strict=True) if c.poll() not in (None, 0, -9)),
                           None)
            if culprit is None:
                sys.exit("the drivers of the many part were not all warm within 600 s")
            failed(*culprit, "before its measured batches")
        time.sleep(0.2)
    before = lock_status()
    waits, round_trips = LongLockWaits(), RoundTrips(drivers[0][1])
    go.touch()
    outputs = [child.communicate()[0] for child in children]
    long_waits, probed = waits.stop(), round_trips.stop()
    after = lock_status()
    found = []
    for child, output, error in zip(children, outputs, errors, strict=True):
        lines = output.splitlines()
        if child.returncode != 0 or not any(line.startswith("MANY ") for line in lines):
            failed(child, error, "in its measured batches")
        found += json.loads(next(line for line in lines if line.startswith("MANY "))[5:])
    protocol = [batch["protocol_s"] for batch in found]
    return {"pipelines": len(found), "at_a_time": len(drivers), "median_protocol_s": statistics.median(protocol),
            "median_protocol_cpu_s": statistics.median(batch["protocol_cpu_s"] for batch in found),
            "max_protocol_s": max(protocol), "lock": {k: after[k] - before[k] for k in LOCK_STATUS},
            "statements_per_batch": (after[STATEMENTS] - before[STATEMENTS] - waits.statements
                                     - round_trips.statements) / len(found),
            "round_trips": probed, "long_lock_waits": long_waits,
            "batches": found}


def driver_batches_in_this_process(go: Path, records: int, parallelism: int, jvm_nice: int,
                                   topics: list[str]) -> list[dict]:
    """A warm-up batch over the first topic (not measured), then, once ``go`` exists, a batch over each other; the
    process's Spark JVM (every thread of it: Linux sets a nice value per thread) at nice ``jvm_nice``."""
    spark_hook().get_conn()
    for jvm in psutil.Process().children(recursive=True) if jvm_nice else []:
        with contextlib.suppress(psutil.NoSuchProcess):  # a process that ended meanwhile
            for thread in jvm.threads():
                with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                    os.setpriority(os.PRIO_PROCESS, thread.id, jvm_nice)
    try:
        one_batch(f"breadth_{topics[0]}", topics[0], records, parallelism)
    finally:
        drop_made_tables()
    go.with_name(f"{go.name}.ready.{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.05)
    found = []
    for topic in topics[1:]:
        try:
            found.append(one_batch(f"breadth_{topic}", topic, records, parallelism))
        finally:
            drop_made_tables()
    return found


def median_calls(batches: list[dict[str, Any]]) -> dict[str, float]:
    """Each protocol call's median seconds over ``batches`` (a batch that did not make the call counts 0)."""
    names = {name for batch in batches for name in batch["calls"]}
    return {name: statistics.median(batch["calls"].get(name, 0.0) for batch in batches) for name in names}


def many(pipelines: int, at_a_time: int, records: int, parallelism: int, jvm_nice: int = 0) -> list[dict[str, Any]]:
    def named(count: int) -> list[str]:
        return [f"breadth_many_{uuid.uuid4().hex[:8]}" for _ in range(count)]

    # alone: one driver, a warm-up and at_a_time pipelines; then at_a_time drivers, a warm-up and their share each
    settings = [("alone", [named(1 + at_a_time)]),
                (f"{at_a_time} at a time", [named(1 + len(range(i, pipelines, at_a_time))) for i in range(at_a_time)])]
    topics = [topic for _, drivers in settings for topics in drivers for topic in topics]
    started = time.monotonic()
    for topic in topics:
        produce_spread(topic, 3, records)
    print(f"[many] {len(topics)} topics of {records:,} page views in {time.monotonic() - started:.1f}s", flush=True)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="eo_breadth_") as workdir:
            for label, drivers in settings:
                result = batches(drivers, records, parallelism, Path(workdir), jvm_nice)
                result["setting"] = label
                lock = result["lock"]
                print(f"[many] {result['pipelines']:>3} pipelines {label:>12}: protocol per batch median "
                      f"{result['median_protocol_s']:.3f}s (the driver's CPU in it "
                      f"{result['median_protocol_cpu_s']:.3f}s), largest {result['max_protocol_s']:.3f}s; store "
                      f"row-lock waits {lock['Innodb_row_lock_waits']} ({lock['Innodb_row_lock_time']} ms), deadlocks "
                      f"{lock['Innodb_deadlocks']}; the server's statements per batch "
                      f"{result['statements_per_batch']:.0f}; a round trip meanwhile, median: the store's "
                      f"{result['round_trips']['store_median_s'] * 1000:.2f} ms, a committed write "
                      f"{result['round_trips']['commit_median_s'] * 1000:.2f} ms, the broker's "
                      f"{result['round_trips']['kafka_median_s'] * 1000:.2f} ms", flush=True)
                results.append(result)
    finally:
        delete_topics(os.environ["EO_KAFKA_BOOTSTRAP"], topics)
    alone, shared = results
    print(f"[many] the protocol's calls, median seconds per batch alone and {at_a_time} at a time:", flush=True)
    alone_calls, shared_calls = median_calls(alone["batches"]), median_calls(shared["batches"])
    for name in sorted(shared_calls, key=lambda n: alone_calls.get(n, 0.0) - shared_calls[n]):
        print(f"[many]   {name:<32} {alone_calls.get(name, 0.0) * 1000:7.1f} ms {shared_calls[name] * 1000:7.1f} ms",
              flush=True)
    loaded = {k: shared["round_trips"][k] / alone["round_trips"][k] if alone["round_trips"][k] else None
              for k in ("store_median_s", "commit_median_s", "kafka_median_s")}
    print(f"[many] {pipelines} pipelines {at_a_time} at a time against alone"
          f"{f' (Spark JVMs at nice {jvm_nice})' if jvm_nice else ''}: protocol per batch "
          f"x{shared['median_protocol_s'] / alone['median_protocol_s']:.2f} (target <= 1.5); under the same load a "
          f"round trip to the store x{loaded['store_median_s'] or 0:.2f}, a committed write "
          f"x{loaded['commit_median_s'] or 0:.2f}, to the broker "
          f"x{loaded['kafka_median_s'] or 0:.2f}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="page views of each wide topic")
    parser.add_argument("--partitions", type=int, default=1000, help="partitions of the wide topic")
    parser.add_argument("--pipelines", type=int, default=20, help="pipelines on one store")
    parser.add_argument("--at-a-time", type=int, default=4, help="their batches at once")
    parser.add_argument("--pipeline-records", type=int, default=20_000, help="page views of each pipeline's topic")
    parser.add_argument("--parallelism", type=int, default=2, help="writer tasks of every batch")
    parser.add_argument("--only", choices=("wide", "many"), help="one part alone")
    parser.add_argument("--jvm-nice", type=int, default=0,
                        help="the many part's drivers' Spark JVMs at this nice value (1-19; 0: as started): what is "
                             "left of the protocol's slowdown is then not Spark's compute taking the same cores")
    parser.add_argument("--short", action="store_true",
                        help="the suite's setting: 20,000 records over 200 partitions; 4 pipelines of 2,000, 2 at "
                             "a time")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--wide-batch", help=argparse.SUPPRESS)  # internal: one wide batch, print its JSON
    parser.add_argument("--driver-batches", help=argparse.SUPPRESS)  # internal: a driver of the many part
    args = parser.parse_args()
    if args.wide_batch:
        topic, partitions, records, parallelism = args.wide_batch.split(":")
        print("WIDE " + json.dumps(wide_batch_in_this_process(topic, int(partitions), int(records), int(parallelism))),
              flush=True)
        return
    if args.driver_batches:
        go, records, parallelism, jvm_nice, topics = args.driver_batches.split(":", 4)
        found = driver_batches_in_this_process(Path(go), int(records), int(parallelism), int(jvm_nice),
                                               topics.split(","))
        print("MANY " + json.dumps(found), flush=True)
        return
    if args.short:
        args.records, args.partitions, args.pipelines, args.at_a_time, args.pipeline_records = 20_000, 200, 4, 2, 2_000
    results: dict[str, Any] = {}
    if args.only in (None, "wide"):
        results["wide"] = wide(args.records, args.partitions, args.parallelism)
    if args.only in (None, "many"):
        results["many"] = many(args.pipelines, args.at_a_time, args.pipeline_records, args.parallelism, args.jvm_nice)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
