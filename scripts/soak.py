"""Soak: the example pipelines run again and again through ``airflow dags test`` while they are killed.

``python scripts/soak.py --events 1000000 --kills 100`` (after ``make up`` and ``. .stack/env``)
produces the events in waves (page views for ``page_views_xa``, ``page_view_events_upsert`` and
``page_views_pg``, request lines for ``ip_counts_kafka``), runs the four DAGs after each wave, SIGKILLs runs
(at a fault point of the code, chosen round-robin over every point a pipeline has, or at a random moment),
restarts the stack's MariaDB (during runs of the pipelines on MariaDB), PostgreSQL's postmaster (during runs
of ``page_views_pg``, whose sink and offset store are both on PostgreSQL) and Kafka in the middle of runs,
retries every run that did not succeed with the same logical date (Airflow's retry/clear), then drains and
compares each sink with the ground truth read from the topics. The last line holds the figures:

``soak: events=... runs=... kills=... (...) db_restarts=... pg_restarts=... broker_restarts=... lost=...
duplicated=... prepared_left=... seconds=...``; the exit status is non-zero unless lost, duplicated and
prepared_left (XA branches on MariaDB and prepared transactions on PostgreSQL) are 0.

It resets the example pipelines first (their tables, the Kafka sink's topics, their offsets): run it on
a stack of its own, not on one whose examples you care about.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # examples/: producers, ground truths and resets

from airflow_eo.core.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV, arm, register_process  # noqa: E402
from airflow_eo.hooks.mysql import EoMySqlHook  # noqa: E402
from airflow_eo.hooks.postgres import EoPostgresHook  # noqa: E402
from airflow_eo.kafka.offsets import KafkaOffsetSource  # noqa: E402
from examples import ip_counts, page_views  # noqa: E402
from examples.state import (  # noqa: E402
    our_prepared_branches,
    pg_app_pv,
    pg_prepared_transactions,
    reset_ip_counts,
    reset_page_views,
    reset_page_views_pg,
    sink_state,
)
from examples.topics import read_topic  # noqa: E402

# Every fault point each example's code passes (airflow_eo.core.failpoints.POINTS), plus a random moment.
PIPELINES: dict[str, tuple[str, ...]] = {
    "page_views_xa": ("after_plan", "during_write", "after_prepare", "in_store_commit", "after_commit_point",
                      "between_xa_commits"),
    "page_view_events_upsert": ("after_plan", "during_write", "in_store_commit", "after_commit_point"),
    "ip_counts_kafka": ("after_plan", "before_produce", "mid_produce", "after_last_send", "after_kafka_commit",
                        "in_store_commit"),
    # Two-phase counts per app, sink and offset store on PostgreSQL (the example DAG as it ships).
    "page_views_pg": ("after_plan", "during_write", "after_prepare", "in_store_commit", "after_commit_point",
                      "between_xa_commits"),
}
#: Pipelines whose sink and store are on PostgreSQL: its restarts go to their runs, MariaDB's to the others'.
ON_POSTGRES = frozenset({"page_views_pg"})
RANDOM_MOMENT = "random_moment"
RUN_TIMEOUT_S = 900
MAX_ATTEMPTS = 20
MAX_KILLS_PER_RUN = 5  # well under MAX_ATTEMPTS, so a run always gets to succeed
OWED_KILL_EVENTS = 1000


def load_stack():
    spec = importlib.util.spec_from_file_location("eo_stack", REPO / "scripts" / "stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Soak:
    events: int
    kills: int
    db_restarts: int
    pg_restarts: int
    broker_restarts: int
    wave: int
    rng: random.Random
    verbose: bool
    stack: object = field(default_factory=load_stack)
    produced: int = 0
    runs: int = 0
    killed: Counter = field(default_factory=Counter)
    restarted: Counter = field(default_factory=Counter)
    clock: datetime = field(default_factory=lambda: datetime.now(timezone.utc).replace(microsecond=0))
    points: dict[str, list[str]] = field(default_factory=dict)
    #: events produced before each pipeline's last successful run started: what it has surely consumed
    consumed: Counter = field(default_factory=Counter)

    # ------------------------------------------------------------------ one run

    def run(self, dag_id: str, logical_date: datetime, fault: str | None = None, restart: str | None = None) -> int:
        """``airflow dags test`` once; ``fault``: a fault point or RANDOM_MOMENT; ``restart``: a service
        the stack restarts (SIGKILL + start) while the run goes on."""
        env = {k: v for k, v in os.environ.items() if k not in (FAILPOINTS_ENV, FAILPOINT_DIR_ENV)}
        if fault and fault != RANDOM_MOMENT:
            env.update(arm(fault, directory=tempfile.mkdtemp(prefix="eo-soak-")))
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "airflow", "dags", "test", dag_id, logical_date.isoformat()],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if FAILPOINT_DIR_ENV in env:
            register_process(env[FAILPOINT_DIR_ENV], "driver", proc.pid)  # kill(driver) of during_write
        timers = []
        if fault == RANDOM_MOMENT:
            timers.append(threading.Timer(self.rng.uniform(2, 25), lambda: proc.poll() is None and os.kill(
                proc.pid, signal.SIGKILL)))
        failed_restarts: list[BaseException] = []
        if restart:
            def restart_service() -> None:
                try:
                    self.stack.restart(restart)
                except BaseException as error:  # the stack's die() is a SystemExit: a thread would drop it
                    failed_restarts.append(error)
            timers.append(threading.Timer(self.rng.uniform(3, 15), restart_service))
        for timer in timers:
            timer.start()
        try:
            output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            print(f"soak: {dag_id} {logical_date} hung for {RUN_TIMEOUT_S}s; killed it", file=sys.stderr)
        for timer in timers:
            timer.join()  # a restart started during the run finishes before the next run
        if failed_restarts:
            raise SystemExit(f"soak: restarting {restart} failed: {failed_restarts[0]}")
        self.runs += 1
        if restart:
            self.restarted[restart] += 1
        if proc.returncode == -signal.SIGKILL:
            self.killed[fault or "outside"] += 1
        outcome = "killed" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}"
        if self.verbose or (proc.returncode not in (0, -signal.SIGKILL) and not restart):
            print(f"  {dag_id} {logical_date:%H:%M:%S} fault={fault} restart={restart}: {outcome} "
                  f"({time.monotonic() - started:.0f}s)")
            if proc.returncode not in (0, -signal.SIGKILL):
                print("\n".join((output or "").splitlines()[-15:]))
        return proc.returncode

    def next_fault(self, dag_id: str) -> str:
        """Round-robin over the pipeline's points and a random moment, so every point gets its kills."""
        queue = self.points.setdefault(dag_id, [])
        if not queue:
            queue.extend([*PIPELINES[dag_id], RANDOM_MOMENT])
            self.rng.shuffle(queue)
        return queue.pop()

    def run_until_done(self, dag_id: str, logical_date: datetime, kills_here: int, restart: str | None) -> None:
        """A run and its retries (same logical date) until one succeeds; the first ``kills_here`` attempts
        are armed to be killed (an attempt that never reaches its point simply succeeds)."""
        for attempt in range(MAX_ATTEMPTS):
            fault = self.next_fault(dag_id) if attempt < kills_here else None
            produced = self.produced
            if self.run(dag_id, logical_date, fault, restart if attempt == 0 else None) == 0:
                self.consumed[dag_id] = produced
                return
        raise SystemExit(f"soak: {dag_id} {logical_date} did not succeed in {MAX_ATTEMPTS} attempts")

    # ------------------------------------------------------------------ the soak

    def produce(self, count: int, bootstrap: str) -> None:
        views = count // 2
        page_views.produce_page_views(bootstrap, views)
        ip_counts.produce_lines(bootstrap, count - views)
        self.produced += count

    def plan_restarts(self, slot_dags: list[str]) -> dict[int, str]:
        """Restarts on distinct random runs: PostgreSQL's during runs of the pipelines on it, MariaDB's during
        the others' (a restart of a server the run does not use tests nothing), Kafka's during any."""
        planned: dict[int, str] = {}
        for service, count, fits in (("postgres", self.pg_restarts, lambda d: d in ON_POSTGRES),
                                     ("mariadb", self.db_restarts, lambda d: d not in ON_POSTGRES),
                                     ("kafka", self.broker_restarts, lambda d: True)):
            free = [s for s, dag_id in enumerate(slot_dags) if s not in planned and fits(dag_id)]
            planned.update(dict.fromkeys(self.rng.sample(free, min(count, len(free))), service))
        return planned

    def go(self, bootstrap: str, mysql: dict, postgres: dict) -> int:
        started = time.monotonic()
        reset_page_views(mysql, "page_views_xa", "page_view_events_upsert")
        reset_page_views_pg(postgres)
        reset_ip_counts(bootstrap, mysql)
        if self.broker_restarts:  # the reset deletes records; a broker killed too soon would bring them back
            self.stack.wait_until_deleted_records_stay_deleted()
        emptied_at = kafka_log_starts(bootstrap)
        waves = max(1, -(-self.events // self.wave))
        # One run (and its retries) per pipeline per wave, in a random order per wave.
        slot_dags = [d for _ in range(waves) for d in self.rng.sample(list(PIPELINES), len(PIPELINES))]
        slots = len(slot_dags)
        # Kills spread evenly over the runs (a few attempts each, like a task's retries); restarts go to
        # random runs.
        kill_plan = [min(MAX_KILLS_PER_RUN, self.kills // slots + (slot < self.kills % slots)) for slot in range(slots)]
        self.rng.shuffle(kill_plan)
        planned = self.plan_restarts(slot_dags)
        for wave in range(waves):
            self.produce(min(self.wave, self.events - self.produced), bootstrap)
            self.clock += timedelta(minutes=5)
            for slot in range(wave * len(PIPELINES), (wave + 1) * len(PIPELINES)):
                self.run_until_done(slot_dags[slot], self.clock, kill_plan[slot], planned.get(slot))
            print(f"soak: wave {wave + 1}/{waves}: {self.produced} events, {self.runs} runs, "
                  f"{sum(self.killed.values())} kills, {dict(self.restarted)} restarts "
                  f"({time.monotonic() - started:.0f}s)", flush=True)
        # Kills still owed (attempts that passed without reaching their point): a little more input so
        # every point is on the way again, one killed attempt, then the retries.
        while sum(self.killed.values()) < self.kills:
            self.produce(OWED_KILL_EVENTS, bootstrap)
            self.clock += timedelta(minutes=5)
            self.run_until_done(self.rng.choice(list(PIPELINES)), self.clock, 1, None)
        self.clock += timedelta(minutes=5)
        for dag_id in PIPELINES:  # drain: a last clean run of each pipeline that has not read all the input yet
            if self.consumed[dag_id] < self.produced:
                self.run_until_done(dag_id, self.clock, 0, None)
        lost, duplicated, prepared = compare(bootstrap, mysql, postgres)
        came_back = {tp: (o, start) for tp, start in kafka_log_starts(bootstrap).items()
                     if start < (o := emptied_at[tp])}
        if came_back:  # the ip_counts comparison counts them: say why it is off instead of blaming the sink
            print("soak: records the reset deleted came back after a broker restart (partition: start after the "
                  "reset -> now): " + ", ".join(f"{t}[{p}] {o}->{n}" for (t, p), (o, n) in sorted(came_back.items())),
                  flush=True)
        kinds = " ".join(f"kills_{k}={n}" for k, n in sorted(self.killed.items()))
        print(f"soak: events={self.produced} runs={self.runs} kills={sum(self.killed.values())} {kinds} "
              f"db_restarts={self.restarted['mariadb']} pg_restarts={self.restarted['postgres']} "
              f"broker_restarts={self.restarted['kafka']} "
              f"lost={lost} duplicated={duplicated} prepared_left={prepared} "
              f"seconds={time.monotonic() - started:.0f}")
        return 0 if lost == duplicated == prepared == 0 and not came_back else 1


def kafka_log_starts(bootstrap: str) -> dict[tuple[str, int], int]:
    """The first offset of each partition of the ip_counts topics."""
    source = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    return source.earliest(source.partitions([ip_counts.SOURCE, ip_counts.SINK]))


def compare(bootstrap: str, mysql: dict, postgres: dict) -> tuple[int, int, int]:
    """(records lost, records duplicated, prepared branches and transactions left) over the four sinks; any
    difference is printed per sink first."""
    pv_truth, ids_truth, _ = page_views.ground_truth(bootstrap)
    pv, id_list = sink_state(mysql)
    ids = Counter(id_list)
    prepared = sum(len(our_prepared_branches(mysql, p)) for p in PIPELINES if p not in ON_POSTGRES)
    prepared += sum(len(pg_prepared_transactions(postgres, p)) for p in ON_POSTGRES)
    found: Counter = Counter()
    # XA on MariaDB and two-phase on PostgreSQL: page views per app, both from the same topic
    for sink, counts in (("xa", pv), ("pg", pg_app_pv(postgres))):
        for app in set(counts) | set(pv_truth):
            difference = counts.get(app, 0) - pv_truth.get(app, 0)
            found[f"{sink}_lost"] += max(0, -difference)
            found[f"{sink}_duplicated"] += max(0, difference)
    found["upsert_lost"] = len(ids_truth - set(ids))  # upsert: one row per event
    found["upsert_duplicated"] = sum(n - 1 for n in ids.values()) + len(set(ids) - ids_truth)
    out_truth, out = ip_counts.true_counts(bootstrap), ip_counts.output_counts(bootstrap)
    for key in set(out) | set(out_truth):  # Kafka: requests per (window, ip) as read_committed readers see them
        difference = out.get(key, 0) - out_truth.get(key, 0)
        found["kafka_lost"], found["kafka_duplicated"] = found["kafka_lost"] + max(0, -difference), \
            found["kafka_duplicated"] + max(0, difference)
    per_batch = Counter((k, json.loads(v)["batch_id"]) for k, v in read_topic(bootstrap, ip_counts.SINK)[0])
    found["kafka_batch_key_twice"] = sum(n - 1 for n in per_batch.values())  # one key of one batch twice
    if any(found.values()):
        print("soak: differences " + " ".join(f"{k}={n}" for k, n in sorted(found.items()) if n), flush=True)
    lost = sum(n for k, n in found.items() if k.endswith("_lost"))
    return lost, sum(found.values()) - lost, prepared


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events to produce over the run")
    parser.add_argument("--kills", type=int, default=100, help="runs to SIGKILL")
    parser.add_argument("--db-restarts", type=int, default=3, help="MariaDB restarts during runs")
    parser.add_argument("--pg-restarts", type=int, default=3,
                        help="PostgreSQL restarts (SIGKILL of the postmaster, start) during runs of page_views_pg")
    parser.add_argument("--broker-restarts", type=int, default=3, help="Kafka broker restarts during runs")
    parser.add_argument("--wave", type=int, default=50_000, help="events produced before each round of runs")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="print every run")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else time.time_ns() % 1_000_000
    print(f"soak: seed={seed} events={args.events} kills={args.kills} wave={args.wave}")
    stack = load_stack()
    if (args.db_restarts or args.pg_restarts or args.broker_restarts) and not all(
            stack.pid_alive(stack.pid_file_of(s)) for s in ("mariadb", "postgres", "kafka")):
        raise SystemExit("soak: restarts need the stack's own MariaDB, PostgreSQL and Kafka (make up); "
                         "or pass --db-restarts 0 --pg-restarts 0 --broker-restarts 0")
    bootstrap = os.environ.get("EO_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("soak: EO_KAFKA_BOOTSTRAP is not set: run `. .stack/env` first")
    mysql = EoMySqlHook("mysql_default").get_connect_kwargs()
    postgres = EoPostgresHook("postgres_default").get_connect_kwargs()
    soak = Soak(args.events, args.kills, args.db_restarts, args.pg_restarts, args.broker_restarts, args.wave,
                random.Random(seed), args.verbose, stack)
    return soak.go(bootstrap, mysql, postgres)


if __name__ == "__main__":
    sys.exit(main())
