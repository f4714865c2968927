"""`make demo`: the page-view pipelines through Airflow, with a SIGKILLed run, checked against the topic.

Runs ``airflow dags test`` for both page-view DAGs several times with new events between
runs; one run of ``page_views_xa`` is killed with SIGKILL while its Spark tasks write,
then the DAG runs again. Then ``ip_counts_kafka`` (Kafka -> Kafka) runs, one run killed
while producing. Finally it prints page views per app from MySQL next to the ground truth
read straight from Kafka, the IP counts against theirs, and ``exactly-once: OK`` or the
differences.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # examples/: producers and resets

from airflow_eo.core.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV, arm, register_process
from airflow_eo.hooks.mysql import EoMySqlHook
from examples import ip_counts, page_views
from examples.state import reset_ip_counts, reset_page_views

PIPELINES = ("page_views_xa", "page_view_events_upsert")


def airflow(*args: str, fault: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in (FAILPOINTS_ENV, FAILPOINT_DIR_ENV)}
    if fault:
        env.update(arm(fault, directory=tempfile.mkdtemp(prefix="eo-demo-")))
    started = time.monotonic()
    command = [sys.executable, "-m", "airflow", *args]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        if fault:
            register_process(env[FAILPOINT_DIR_ENV], "driver", child.pid)  # kill(driver) of during_write
        stdout, stderr = child.communicate()
    done = subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
    status = "killed by SIGKILL" if done.returncode == -signal.SIGKILL else f"exit {done.returncode}"
    print(f"  airflow {' '.join(args)}{f'  [fault: {fault}]' if fault else ''}: {status} "
          f"({time.monotonic() - started:.0f}s)")
    for line in (done.stdout + done.stderr).splitlines():
        if "records in" in line and "rows out" in line and "micro_batch" in line:
            print("    " + line.split("[info     ]", 1)[-1].split("[airflow.task")[0].strip())
    if done.returncode not in (0, -signal.SIGKILL):
        print(done.stdout[-3000:] + done.stderr[-3000:])
    return done.returncode


def run(dag_id: str, when: datetime, fault: str | None = None) -> int:
    return airflow("dags", "test", dag_id, when.isoformat(), fault=fault)


def ip_counts_demo(bootstrap: str, mysql: dict, clock: datetime, differences: list[str]) -> int:
    """Kafka -> Spark -> Kafka: 5-second counts per IP through Kafka transactions, with a killed run."""
    print("\nip_counts_kafka: request lines -> counts per (5-second window, ip) -> Kafka, in Kafka transactions")
    reset_ip_counts(bootstrap, mysql)
    failures = 0
    ip_counts.produce_lines(bootstrap, 3000)
    failures += run("ip_counts_kafka", clock) != 0
    ip_counts.produce_lines(bootstrap, 3000)
    print("  killing the next run while it produces its output")
    clock += timedelta(minutes=1)
    if run("ip_counts_kafka", clock, fault="mid_produce") != -signal.SIGKILL:
        failures += 1
    failures += run("ip_counts_kafka", clock) != 0
    truth, committed = ip_counts.true_counts(bootstrap), ip_counts.output_counts(bootstrap)
    seen_uncommitted = ip_counts.output_counts(bootstrap, "read_uncommitted")
    print(f"  (window, ip) keys: {len(committed)} in ip_count_sink, {len(truth)} in the input; "
          f"sum of counts: {sum(committed.values())} (read_committed), {sum(truth.values())} (truth), "
          f"{sum(seen_uncommitted.values())} (read_uncommitted, includes the killed run's aborted output)")
    if committed != truth:
        differences.append("ip_count_sink")
    return failures


def main() -> int:
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    mysql = EoMySqlHook().get_connect_kwargs()
    page_views.ensure_topic(bootstrap, page_views.TOPIC)
    reset_page_views(mysql, *PIPELINES)
    print("airflow_eo demo: page views through Kafka -> Spark -> MariaDB, exactly once")
    clock = datetime.now(timezone.utc).replace(microsecond=0)
    step = timedelta(minutes=5)
    failures = 0

    for round_no, count in enumerate((4000, 3000), start=1):
        page_views.produce_page_views(bootstrap, count)
        print(f"round {round_no}: produced {count} page views")
        for dag_id in PIPELINES:
            failures += run(dag_id, clock) != 0
        clock += step

    page_views.produce_page_views(bootstrap, 3000)
    print("round 3: produced 3000 page views; killing page_views_xa while Spark tasks write")
    if run("page_views_xa", clock, fault="during_write") != -signal.SIGKILL:
        print("  the run was expected to die by SIGKILL")
        failures += 1
    print("  re-running the DAG after the crash")
    clock += step
    for dag_id in PIPELINES:
        failures += run(dag_id, clock) != 0

    pv_truth, ids_truth, _ = page_views.ground_truth(bootstrap)
    import pymysql

    conn = pymysql.connect(**mysql)
    with conn.cursor() as cur:
        cur.execute("SELECT app_id, pv FROM app_pv")
        pv_sink = {app: int(n) for app, n in cur.fetchall()}
        cur.execute("SELECT event_id FROM page_view_events")
        ids_sink = [r[0] for r in cur.fetchall()]
    conn.close()

    print(f"\n{'app_id':<10}{'app_pv (MySQL)':>16}{'truth (Kafka)':>16}")
    differences = []
    for app in sorted(set(pv_truth) | set(pv_sink)):
        mark = "" if pv_sink.get(app) == pv_truth.get(app) else "   <-- differs"
        if mark:
            differences.append(app)
        print(f"{app:<10}{pv_sink.get(app, 0):>16}{pv_truth.get(app, 0):>16}{mark}")
    print(f"{'total':<10}{sum(pv_sink.values()):>16}{sum(pv_truth.values()):>16}")
    print(f"page_view_events: {len(ids_sink)} rows, {len(set(ids_sink))} distinct; {len(ids_truth)} events in Kafka")
    if set(ids_sink) != ids_truth or len(ids_sink) != len(set(ids_sink)):
        differences.append("page_view_events")
    failures += ip_counts_demo(bootstrap, mysql, clock + step, differences)
    if failures:
        differences.append(f"{failures} DAG run(s) failed")
    print("exactly-once: OK" if not differences else f"exactly-once: DIFFERENCES in {', '.join(differences)}")
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
