"""`make demo`: the page-view pipelines through Airflow, with SIGKILLed runs, checked against the topic.

Runs ``airflow dags test`` for the three example DAGs in two rounds; runs of different DAGs go side by side (separate
processes and pipelines). In the first round ``page_views_xa`` is killed with SIGKILL while its Spark tasks write and
``ip_counts_kafka`` (Kafka -> Kafka) while it produces its output, next to a run of ``page_view_events_upsert``; the
second round, after new request lines, re-runs the two killed DAGs. Two rounds rather than three keep the demo under
two minutes on two cores: each ``airflow dags test`` starts Airflow and a Spark driver (~15 s alone), and a third
round added ~45 s. Finally it prints page views per app from MySQL next to the ground truth read straight from
Kafka, the IP counts against theirs, and ``exactly-once: OK`` or the differences.
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


def start(dag_id: str, when: datetime, fault: str | None = None) -> tuple[subprocess.Popen[str], str, float]:
    """``airflow dags test dag_id when`` in a child process, armed with ``fault`` (a SIGKILL at that failpoint)."""
    env = {k: v for k, v in os.environ.items() if k not in (FAILPOINTS_ENV, FAILPOINT_DIR_ENV)}
    if fault:
        env.update(arm(fault, directory=tempfile.mkdtemp(prefix="eo-demo-")))
    child = subprocess.Popen([sys.executable, "-m", "airflow", "dags", "test", dag_id, when.isoformat()], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if fault:
        register_process(env[FAILPOINT_DIR_ENV], "driver", child.pid)  # kill(driver) of during_write
    label = f"airflow dags test {dag_id} {when.isoformat()}" + (f"  [fault: {fault}]" if fault else "")
    return child, label, time.monotonic()


def run(*runs: tuple[str, datetime, str | None]) -> list[int]:
    """Runs of different DAGs side by side (each its own process, Spark driver and pipeline: they share nothing but
    the servers); their exit codes, in order."""
    started = [start(dag_id, when, fault) for dag_id, when, fault in runs]
    codes = []
    for child, label, began in started:
        stdout, stderr = child.communicate()
        status = "killed by SIGKILL" if child.returncode == -signal.SIGKILL else f"exit {child.returncode}"
        print(f"  {label}: {status} ({time.monotonic() - began:.0f}s)")
        for line in (stdout + stderr).splitlines():
            if "records in" in line and "rows out" in line and "micro_batch" in line:
                print("    " + line.split("[info     ]", 1)[-1].split("[airflow.task")[0].strip())
        if child.returncode not in (0, -signal.SIGKILL):
            print(stdout[-3000:] + stderr[-3000:])
        codes.append(child.returncode)
    return codes


def ip_counts_result(bootstrap: str, differences: list[str]) -> None:
    truth, committed = ip_counts.true_counts(bootstrap), ip_counts.output_counts(bootstrap)
    seen_uncommitted = ip_counts.output_counts(bootstrap, "read_uncommitted")
    print(f"\nip_counts_kafka: (window, ip) keys: {len(committed)} in ip_count_sink, {len(truth)} in the input; "
          f"sum of counts: {sum(committed.values())} (read_committed), {sum(truth.values())} (truth), "
          f"{sum(seen_uncommitted.values())} (read_uncommitted, includes the killed run's aborted output)")
    if committed != truth:
        differences.append("ip_count_sink")


def main() -> int:
    began = time.monotonic()
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    mysql = EoMySqlHook().get_connect_kwargs()
    page_views.ensure_topic(bootstrap, page_views.TOPIC)
    reset_page_views(mysql, *PIPELINES)
    reset_ip_counts(bootstrap, mysql)
    print("airflow_eo demo: page views through Kafka -> Spark -> MariaDB, and request lines through Kafka -> Spark -> "
          "Kafka (counts per 5-second window and IP, in Kafka transactions), exactly once")
    clock = datetime.now(timezone.utc).replace(microsecond=0)
    step = timedelta(minutes=5)
    xa, upsert = PIPELINES
    expected: list[int] = []
    codes: list[int] = []

    page_views.produce_page_views(bootstrap, 4000)
    ip_counts.produce_lines(bootstrap, 3000)
    print("round 1: produced 4000 page views and 3000 request lines; killing page_views_xa while its Spark tasks "
          "write and ip_counts_kafka while it produces its output; page_view_events_upsert runs beside them")
    codes += run((xa, clock, "during_write"), ("ip_counts_kafka", clock, "mid_produce"), (upsert, clock, None))
    expected += [-signal.SIGKILL, -signal.SIGKILL, 0]

    ip_counts.produce_lines(bootstrap, 3000)
    print("round 2: produced 3000 request lines; re-running the killed DAGs")
    clock += step
    codes += run((xa, clock, None), ("ip_counts_kafka", clock, None))
    expected += [0, 0]

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
    ip_counts_result(bootstrap, differences)
    failures = sum(code != want for code, want in zip(codes, expected, strict=True))
    if failures:
        differences.append(f"{failures} DAG run(s) did not end as planned")
    print(f"demo took {time.monotonic() - began:.0f}s")
    print("exactly-once: OK" if not differences else f"exactly-once: DIFFERENCES in {', '.join(differences)}")
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
