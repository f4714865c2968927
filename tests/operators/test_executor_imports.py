"""What a Spark executor imports when it unpickles a sink's partition writers and runs them needs only what a cluster's
executors have (``scripts/spark_cluster.py``'s ``worker_venv``: pyspark, pyarrow, pandas, pymysql, psycopg, with
airflow_eo shipped): a driver-side library imported at a module's top (SQLAlchemy, once) failed every task of a batch
on the standalone cluster and over Spark Connect, with ``ModuleNotFoundError``, where local mode passed."""

from __future__ import annotations

import subprocess
import sys

#: the top-level packages an executor may import: the standard library's and these
EXECUTOR_PACKAGES = {"airflow_eo", "pyspark", "py4j", "pyarrow", "pandas", "numpy", "pymysql", "psycopg",
                     "psycopg_binary", "psycopg_c", "dateutil", "pytz", "tzdata", "six", "typing_extensions",
                     "cloudpickle"}
#: the modules whose code runs in the executors' tasks (partition writers, look-ups, the task's runner)
EXECUTOR_MODULES = ("airflow_eo.spark.partition_runner", "airflow_eo.mysql.writer", "airflow_eo.postgres.writer",
                    "airflow_eo.mysql.database", "airflow_eo.postgres.database", "airflow_eo.sqlsink.seen_ids",
                    "airflow_eo.sqlsink.change_positions", "airflow_eo.spark.dedup")

ONLY_EXECUTOR_PACKAGES = """
import importlib, sys
allowed = set(sys.argv[1].split(",")) | set(sys.stdlib_module_names)

class Refuse:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in allowed and not top.startswith("_"):  # (the interpreter's private modules: _sysconfigdata..)
            raise ModuleNotFoundError(f"No module named {name!r} (not on a cluster's executors)")
        return None

sys.meta_path.insert(0, Refuse())
for module in sys.argv[2:]:
    importlib.import_module(module)
print("imported")
"""


def test_the_executors_modules_import_with_only_what_a_clusters_executors_have():
    done = subprocess.run([sys.executable, "-c", ONLY_EXECUTOR_PACKAGES, ",".join(sorted(EXECUTOR_PACKAGES)),
                           *EXECUTOR_MODULES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr[-3000:]
