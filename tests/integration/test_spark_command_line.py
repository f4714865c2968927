"""A classic session's Spark conf is spark-submit's command line (``--conf k=v``), which every local user can read
(``ps``, ``/proc/<pid>/cmdline``): the secrets of ``spark_conf`` (file-system keys as ``spark.hadoop.*``, a catalog's
as ``spark.sql.catalog.*``) are set on the running session instead, where Spark still uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

CHILD = """
import json, sys
import psutil
from airflow_eo.spark.session import get_session

secret = sys.argv[1]
spark = get_session(conf={"spark.hadoop.fs.s3a.secret.key": secret, "spark.hadoop.fs.s3a.access.key": "A" + secret,
                          "spark.sql.catalog.lake.credential": "client:" + secret, "spark.hadoop.fs.s3a.endpoint":
                          "http://127.0.0.1:1"})
driver = psutil.Process(spark.sparkContext._gateway.proc.pid)


def command_line(process):
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):  # a child that ended meanwhile has no command line to show
        return ""


command_lines = [command_line(p) for p in [driver, *driver.children(recursive=True)]]
hadoop = spark._jsparkSession.sessionState().newHadoopConf()  # what a file system of a query is made with
print(json.dumps({"command_lines": command_lines, "secret_key": hadoop.get("fs.s3a.secret.key"),
                  "access_key": hadoop.get("fs.s3a.access.key"), "endpoint": hadoop.get("fs.s3a.endpoint"),
                  "credential": spark.conf.get("spark.sql.catalog.lake.credential")}))
spark.stop()
"""


def test_no_secret_of_spark_conf_is_on_the_drivers_command_line(tmp_path):
    secret = f"s3cr3t{uuid.uuid4().hex}"
    done = subprocess.run([sys.executable, "-c", CHILD, secret], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("spark.hadoop.fs.s3a.endpoint" in line for line in found["command_lines"])  # the JVM's own line
    assert not [line for line in found["command_lines"] if secret in line], "a secret is on a command line"
    assert (found["secret_key"], found["access_key"], found["credential"], found["endpoint"]) == (
        secret, "A" + secret, "client:" + secret, "http://127.0.0.1:1")
