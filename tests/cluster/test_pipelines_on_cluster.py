"""The example DAGs on a real Spark cluster and over Spark Connect, chosen only by ``spark_conn_id``.

The cluster's executors (and the Connect server's Python workers) run a Python without
``airflow_eo``: every batch below works only because the session ships the package. Each sink
ends equal to the ground truth read independently from the topics, after SIGKILLs of the
Airflow task while executors write, of an executor JVM, and of the Spark Connect server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from airflow_eo.core.failpoints import FAILPOINT_DIR_ENV, FAILPOINTS_ENV
from examples import ip_counts
from examples.page_views import produce_page_views
from examples.state import reset_ip_counts
from examples.topics import read_records
from tests.support.kafka import create_topic
from tests.support.page_views import (
    REPO,
    UPSERT_PIPELINE,
    XA_PIPELINE,
    assert_exactly_once,
    batch_rows,
    reset,
    run_child,
    run_dag,
)

SPARK_DIR = Path(os.environ.get("EO_STACK_DIR", REPO / ".stack")) / "spark"


def run_on(conn_id: str, dag_id: str, logical_date: datetime | None = None, fault: str | None = None,
           env: dict[str, str] | None = None) -> str:
    """Run the DAG with ``spark_conn_id=conn_id``; the output, after checking how the run ended."""
    done = run_dag(dag_id, logical_date, fault=fault, env=env, conf={"spark_conn_id": conn_id})
    output = done.stdout + done.stderr
    expected = -signal.SIGKILL if fault in ("during_write", "mid_produce") else 0
    assert done.returncode == expected, output[-4000:]
    return output


def assert_kafka_output_exact(bootstrap: str) -> None:
    assert ip_counts.output_counts(bootstrap) == ip_counts.true_counts(bootstrap)
    assert ip_counts.output_counts(bootstrap, "read_committed") == ip_counts.true_counts(bootstrap)


def test_on_a_standalone_cluster_with_task_and_executor_kills(spark_cluster, bootstrap, mysql_kwargs, airflow_db,
                                                               tmp_path):
    conn = "spark_cluster"
    reset(mysql_kwargs, XA_PIPELINE, UPSERT_PIPELINE)
    produce_page_views(bootstrap, 3000)

    # XA: the Airflow task (the driver) is SIGKILLed by an executor mid-write; its retry resumes the batch.
    when = datetime.now(timezone.utc)
    run_on(conn, "page_views_xa", when, fault="during_write")
    output = run_on(conn, "page_views_xa", when)
    assert f"Spark session on {spark_cluster.master}" in output
    assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)

    # Upsert: an executor JVM is SIGKILLed mid-write; Spark reruns its task on the other worker. (The driver
    # killed mid-write is the XA case above; the local crash chains kill it at every step for every sink.)
    fault_env = {FAILPOINT_DIR_ENV: str(tmp_path)}
    run_on(conn, "page_view_events_upsert", fault="task_write=1*kill_executor", env=fault_env)
    assert (tmp_path / "fired-task_write-0").exists(), "no executor was killed"
    assert_exactly_once(mysql_kwargs, bootstrap, UPSERT_PIPELINE)

    # Kafka transactional sink: the executors aggregate, the driver produces in one transaction. (Its kills are
    # the driver's, at every step, in tests/integration/test_kafka_sink.py: the cluster changes nothing there.)
    reset_ip_counts(bootstrap, mysql_kwargs)
    ip_counts.produce_lines(bootstrap, 3000)
    run_on(conn, "ip_counts_kafka")
    assert_kafka_output_exact(bootstrap)


def test_over_spark_connect_with_a_server_restart_mid_batch(spark_cluster, bootstrap, mysql_kwargs, airflow_db):
    conn = "spark_connect"
    reset(mysql_kwargs, XA_PIPELINE, UPSERT_PIPELINE)
    produce_page_views(bootstrap, 3000)
    output = run_on(conn, "page_views_xa")
    assert f"Spark session on {spark_cluster.connect}" in output
    assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)

    reset_ip_counts(bootstrap, mysql_kwargs)
    ip_counts.produce_lines(bootstrap, 3000)
    run_on(conn, "ip_counts_kafka")
    assert_kafka_output_exact(bootstrap)

    # The Connect server dies (SIGKILL) while a batch runs on it, and comes back.
    produce_page_views(bootstrap, 30_000)
    when = datetime.now(timezone.utc)
    env = {k: v for k, v in os.environ.items() if k != FAILPOINTS_ENV}
    args = [sys.executable, str(REPO / "scripts" / "run_dag.py"), "page_views_xa", when.isoformat(),
            '{"spark_conn_id": "spark_connect"}']
    running = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any(b["state"] == "planned" for b in batch_rows(mysql_kwargs, XA_PIPELINE)):
            assert running.poll() is None and time.monotonic() < deadline, "the batch was never planned"
            time.sleep(0.2)
        os.kill(int((SPARK_DIR / "connect.pid").read_text()), signal.SIGKILL)
        restarted = subprocess.run([sys.executable, str(REPO / "scripts" / "spark_cluster.py"), "up"],
                                   capture_output=True, text=True, timeout=420)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        running.communicate(timeout=600)  # failed, or its task retry went through on the new server
    finally:
        if running.poll() is None:
            running.kill()
    run_on(conn, "page_views_xa", when)  # the same run again: resumes, or returns its committed summary
    assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)  # the batch's ranges reach the topic's end


@pytest.mark.parametrize(("token", "works"), [("right", True), ("wrong", False)])
def test_a_spark_connect_connection_passes_its_token(spark_cluster, token, works, monkeypatch):
    """The connection's password is the token (the Spark provider's SparkConnectHook builds the URL)."""
    from airflow_eo.core.errors import ConfigurationError

    host, port = spark_cluster.connect_token_url.removeprefix("sc://").rsplit(":", 1)
    secret = spark_cluster.token if token == "right" else "not-the-token"
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TOKEN_TEST",
                       f'{{"conn_type": "spark_connect", "host": "{host}", "port": {port}, "password": "{secret}"}}')
    code = ("from airflow_eo.hooks.spark import SparkSessionHook\n"
            "print('count', SparkSessionHook('spark_token_test').get_conn().range(7).count())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    output = done.stdout + done.stderr
    if works:
        assert done.returncode == 0 and "count 7" in output, output[-3000:]
    else:
        assert done.returncode != 0 and ConfigurationError.__name__ in output, output[-3000:]
        assert "cannot open a Spark Connect session" in output and secret not in output, output[-3000:]


def test_a_delta_merge_over_spark_connect(spark_cluster, bootstrap, mysql_kwargs, topic_name, tmp_path):
    """A Delta MERGE with ``"add"`` over Spark Connect: the server was started with Delta's jars and SQL extension
    (``scripts/spark_cluster.py``: a client cannot add them), the sink's table creation and MERGE are SQL (Delta's
    Python builders would need Delta's Connect plugin on the server), and its ``txnAppId`` / ``txnVersion`` reach the
    server's session as SQL confs: the table, read back with delta-rs, has the batch's counts and its txn."""
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 400, topic=topic_name)
    path, pipeline = tmp_path / "app_pv", f"delta_connect_{topic_name}"
    job = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
           "run_id": "manual__1", "transform": "SELECT app_id, 1 AS pv FROM kafka_batch",
           "options": {"spark_conn_id": "spark_connect"},
           "sink": {"kind": "DeltaTableSink", "path": str(path), "key_columns": ["app_id"], "updates": {"pv": "add"}}}
    done = run_child(["-m", "tests.support.operator_child", json.dumps(job)])
    assert done.returncode == 0 and f"Spark session on {spark_cluster.connect}" in done.stdout + done.stderr, \
        (done.stdout + done.stderr)[-4000:]
    [batch] = batch_rows(mysql_kwargs, pipeline)
    truth = Counter(json.loads(r.value)["app_id"] for r in read_records(bootstrap, topic_name)[0])
    table = DeltaTable(str(path))
    assert {r["app_id"]: r["pv"] for r in table.to_pyarrow_table().to_pylist()} == truth
    assert batch["state"] == "committed" and table.transaction_version(f"airflow_eo.{pipeline}") == batch["batch_id"]


def test_an_iceberg_append_on_the_standalone_cluster_and_a_bad_record_failing_on_an_executor(
        spark_cluster, bootstrap, mysql_kwargs, topic_name, tmp_path):
    """An Iceberg append on the standalone cluster's executors (a classic session: the session ships the package and
    Iceberg's jars to executors without either), one pass (``core/write_strategy``: FAIL_IN_TASKS); then a batch
    holding a bad record: the executor's task that reads it fails (every retry of it), the job fails, nothing is
    staged or published, and the error names the record."""
    from pyiceberg.table import StaticTable

    create_topic(bootstrap, topic_name, 2)
    events = produce_page_views(bootstrap, 400, topic=topic_name)
    location, pipeline = tmp_path / "lake" / "db" / "events", f"iceberg_cluster_{topic_name}"
    job = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
           "options": {"spark_conn_id": "spark_cluster"},
           "sink": {"kind": "IcebergTableSink", "table": "lake.db.events", "warehouse": str(tmp_path / "lake")}}
    done = run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": "manual__1"})])
    said = done.stdout + done.stderr
    assert done.returncode == 0 and f"Spark session on {spark_cluster.master}" in said, said[-4000:]
    summary = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))
    assert (summary["records_in"], summary["rows_out"]) == (400, 400) and "count" not in summary["seconds"]
    table = StaticTable.from_metadata(str(location))
    assert sorted(r["event_id"] for r in table.scan().to_arrow().to_pylist()) == sorted(e["event_id"] for e in events)
    snapshots = len(table.metadata.snapshots)

    produce_page_views(bootstrap, 20, topic=topic_name, raw_values=[b"{not json"])
    failed = run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": "manual__2"})])
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "1 bad record(s) in this batch; the first: " in said, said[-4000:]
    assert len(StaticTable.from_metadata(str(location)).metadata.snapshots) == snapshots, "nothing staged"
    assert [b["state"] for b in batch_rows(mysql_kwargs, pipeline)] == ["committed", "planned"]
