"""Fixed cost of one micro-batch: local Spark in the task vs a long-running Spark Connect server, in one run.

    make up spark-cluster && . .stack/env && . .stack/spark/env && .venv/bin/python scripts/fixed_cost.py

For each engine (``local``: ``local[*]`` inside the task; ``connect``: the ``spark_connect``
connection), in a fresh process each as a real task runs: the time inside the task (from
entering the operator's ``execute`` to its return) of an empty batch and of a batch of
``--events`` page views into the upsert sink; then the wall time of a whole
``airflow dags test page_view_events_upsert`` process with the same number of new events.
Numbers, not assertions: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from airflow_eo.hooks.mysql import EoMySqlHook  # noqa: E402
from examples import page_views  # noqa: E402
from examples.state import reset_page_views  # noqa: E402

INSIDE_THE_TASK = """
import json, sys, time, uuid
from airflow_eo.examples import page_views
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink
topic, table, spark_conn_id = sys.argv[1:4]
op = KafkaMicroBatchOperator(task_id="fixed_cost", pipeline_id=f"fixed_cost_{topic}", topics=[topic],
                             schema=page_views.SCHEMA, sink=MySqlUpsertSink(table=table, key_columns=["event_id"]),
                             spark_conn_id=spark_conn_id or None)
started = time.monotonic()
summary = op.execute({"run_id": f"manual__{uuid.uuid4().hex}"})
print("RESULT " + json.dumps({"seconds": time.monotonic() - started, "records_in": summary["records_in"],
                             "phases": summary["seconds"]}))
"""


def inside_the_task(topic: str, table: str, spark_conn_id: str) -> dict:
    done = subprocess.run([sys.executable, "-c", INSIDE_THE_TASK, topic, table, spark_conn_id], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the task failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def whole_dag_test(spark_conn_id: str, events: int) -> float:
    page_views.produce_page_views(os.environ["EO_KAFKA_BOOTSTRAP"], events)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "page_view_events_upsert", "-c",
                           json.dumps({"spark_conn_id": spark_conn_id})], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"airflow dags test failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--engines", default="local,connect", help="comma-separated: local, connect")
    args = parser.parse_args()
    bootstrap = os.environ["EO_KAFKA_BOOTSTRAP"]
    mysql = EoMySqlHook().get_connect_kwargs()
    engines = {"local": "", "connect": "spark_connect"}
    rows = []
    for name in args.engines.split(","):
        conn_id = engines[name]
        empty_topic, full_topic = (f"fixed_cost_{uuid.uuid4().hex[:8]}" for _ in range(2))
        page_views.ensure_topic(bootstrap, empty_topic)
        page_views.produce_page_views(bootstrap, args.events, topic=full_topic)
        table = page_views.create_table_like(mysql, "page_view_events", f"fixed_cost_{uuid.uuid4().hex[:8]}")
        empty = inside_the_task(empty_topic, table, conn_id)
        full = inside_the_task(full_topic, table, conn_id)
        assert full["records_in"] == args.events, full
        reset_page_views(mysql, "page_view_events_upsert")
        page_views.produce_page_views(bootstrap, 0)  # the topic exists
        whole_dag_test(conn_id, 0)  # the first run reads the topic's history: not what is measured
        dag_seconds = whole_dag_test(conn_id, args.events)
        rows.append((name, empty["seconds"], full["seconds"], dag_seconds, full["phases"]))
    print(f"\n{'engine':<9}{'empty batch (s)':>17}{f'{args.events:,}-record batch (s)':>26}"
          f"{'airflow dags test (s)':>24}   (inside the task, fresh process each)")
    for name, empty_s, full_s, dag_s, _ in rows:
        print(f"{name:<9}{empty_s:>17.2f}{full_s:>26.2f}{dag_s:>24.1f}")
    for name, *_, phases in rows:
        print(f"{name}: phases of the {args.events:,}-record batch (s): {phases}")


if __name__ == "__main__":
    main()
