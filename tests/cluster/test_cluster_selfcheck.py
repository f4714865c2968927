"""Self-check of the local Spark cluster (``scripts/spark_cluster.py``): standalone master, Connect, token.

Every Spark client runs in a subprocess: a classic session is one per process, and a Spark Connect session
marks the whole process as Connect (pyspark sets ``SPARK_CONNECT_MODE_ENABLED``), which would turn the
classic local sessions of other tests in this process into Connect ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.kafka import create_topic
from tests.support.spark_cluster import SPARK_DIR, SparkCluster

# A classic session on the standalone master, configured from the AIRFLOW_CONN_SPARK_CLUSTER connection.
CLASSIC_JOB = r'''
import json, os, sys
from pyspark.sql import SparkSession

conn = json.loads(os.environ["AIRFLOW_CONN_SPARK_CLUSTER"])
builder = SparkSession.builder.master(f"{conn['host']}:{conn['port']}").appName("airflow_eo cluster selfcheck")
# One core: the job needs one of the cluster's two slots only.
conf = {**conn["extra"]["conf"], "spark.cores.max": "1", "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false"}
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()


def probe(_):
    import os, sys
    try:
        import airflow_eo  # noqa: F401
        airflow_eo_import = "ok"
    except ImportError as exc:
        airflow_eo_import = repr(exc)
    ancestors, pid = [], os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        ancestors.append(pid)
    yield {"python": sys.executable, "pid": os.getpid(), "ancestors": ancestors, "cwd": os.getcwd(),
           "airflow_eo": airflow_eo_import}


try:
    rows = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
finally:
    spark.stop()
print(json.dumps({"driver_pid": os.getpid(), "executors": rows}))
'''

CONNECT_JOB = r'''
import json, os, sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(os.environ["EO_SPARK_CONNECT"]).getOrCreate()


def probe(batches):
    import sys
    import pyarrow as pa
    try:
        import airflow_eo  # noqa: F401
        airflow_eo_import = "ok"
    except ImportError as exc:
        airflow_eo_import = repr(exc)
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"python": [sys.executable] * batch.num_rows,
                                          "airflow_eo": [airflow_eo_import] * batch.num_rows})


try:
    out = {"range": spark.range(10).count()}
    kafka = (spark.read.format("kafka").option("kafka.bootstrap.servers", os.environ["EO_KAFKA_BOOTSTRAP"])
             .option("subscribe", sys.argv[1]).option("startingOffsets", "earliest").load())
    out["kafka_count"] = kafka.count()
    out["kafka_values"] = sorted(row.value.decode() for row in kafka.select("value").collect())
    out["workers"] = [row.asDict() for row in spark.range(1).mapInArrow(probe, "python string, airflow_eo string")
                      .collect()]
finally:
    spark.stop()
print(json.dumps(out))
'''

# create(), not getOrCreate(): a Connect client's default session would be reused whatever the URL.
TOKEN_JOB = r'''
import json, os
from pyspark.sql import SparkSession

base, token = os.environ["EO_SPARK_CONNECT_TOKEN_URL"], os.environ["EO_SPARK_CONNECT_TOKEN"]
results = {}
for name, url in (("right", f"{base}/;token={token}"), ("wrong", f"{base}/;token=not-{token}"), ("missing", base)):
    session = None
    try:
        session = SparkSession.builder.remote(url).create()
        results[name] = session.range(10).count()
    except Exception as exc:
        results[name] = f"error: {type(exc).__name__}: {exc}"[:600]
    finally:
        if session is not None:
            try:
                session.stop()
            except Exception:
                pass
print(json.dumps(results))
'''


def run_client(code: str, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 150) -> dict:
    """Run a Spark client in a fresh Python (the test venv's); return the JSON its last stdout line prints."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_CONNECT_AUTHENTICATE_TOKEN",
                          "SPARK_LOCAL_REMOTE", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env={**clean, **(env or {})}, stdin=subprocess.DEVNULL)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"client failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


def test_classic_job_runs_on_standalone_executors_with_the_worker_python(spark_cluster: SparkCluster, tmp_path):
    # The executors' Python is the driver's PYSPARK_PYTHON: a SparkContext started in a running Python
    # ignores spark.pyspark.python (the connection's conf carries it; the driver must export it).
    out = run_client(CLASSIC_JOB, cwd=tmp_path, env={"PYSPARK_PYTHON": spark_cluster.worker_python})
    assert len(out["executors"]) == 2
    for executor in out["executors"]:
        assert executor["python"] == spark_cluster.worker_python
        assert "No module named 'airflow_eo'" in executor["airflow_eo"]
        assert executor["pid"] != out["driver_pid"]
        assert out["driver_pid"] not in executor["ancestors"]  # launched by a worker, not by the driver
        assert Path(executor["cwd"]).is_relative_to(SPARK_DIR / "work")  # the worker's SPARK_WORKER_DIR


def test_connect_runs_queries_and_reads_kafka(spark_cluster: SparkCluster, bootstrap, tmp_path):
    from confluent_kafka import Producer

    topic = create_topic(bootstrap, f"cluster_{uuid.uuid4().hex[:10]}", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0

    out = run_client(CONNECT_JOB, topic, cwd=tmp_path)
    assert out["range"] == 10
    assert out["kafka_count"] == 5
    assert out["kafka_values"] == [f"v{i}" for i in range(5)]
    [worker] = out["workers"]
    assert worker["python"] == spark_cluster.worker_python
    assert "No module named 'airflow_eo'" in worker["airflow_eo"]


def test_connect_token_is_required(spark_cluster: SparkCluster, tmp_path):
    out = run_client(TOKEN_JOB, cwd=tmp_path, timeout=120)
    assert out["right"] == 10
    assert "Invalid authentication token" in str(out["wrong"]), out["wrong"]
    assert "No authentication token provided" in str(out["missing"]), out["missing"]


def test_airflow_connections_resolve(spark_cluster: SparkCluster):
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk import BaseHook

    cluster = BaseHook.get_connection("spark_cluster")
    assert (cluster.conn_type, f"{cluster.host}:{cluster.port}") == ("spark", spark_cluster.master)
    assert cluster.extra_dejson["deploy-mode"] == "client"
    assert cluster.extra_dejson["conf"]["spark.pyspark.python"] == spark_cluster.worker_python
    assert BaseHook.get_connection("spark_connect").conn_type == "spark_connect"
    assert SparkConnectHook("spark_connect").get_connection_url() == f"{spark_cluster.connect}/"
    assert SparkConnectHook("spark_connect_token").get_connection_url() == spark_cluster.token_url(spark_cluster.token)
