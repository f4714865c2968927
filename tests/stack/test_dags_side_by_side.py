"""Several ``airflow dags test`` at once on a metadata database that has never seen the DAG folder.

Each ``airflow dags test`` writes every DAG of the folder into the metadata database before its run; on a database
that has never seen them, runs started together insert the same rows and all but one die with an IntegrityError
(a fresh clone's first ``make demo`` did). ``scripts/stack.py up`` writes the folder once
(``airflow_dags_reserialize``) right after the migration, so runs side by side only compare rows. This builds a
fresh metadata database the way ``up`` does, over a folder of nine small DAGs, and starts three runs together.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.children import output_within
from tests.support.stack import load_stack

DAG_FILE = '''from datetime import datetime

from airflow.sdk import DAG, task

with DAG("side_by_side_{n}", schedule=None, start_date=datetime(2026, 1, 1)):
    @task
    def answer() -> int:
        return {n}

    answer()
'''


def test_runs_started_together_on_a_fresh_metadata_database_all_succeed(tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    for n in range(1, 10):  # as many files as dags/ has DAGs: the more rows each run writes, the wider the race
        (dags / f"side_by_side_{n}.py").write_text(DAG_FILE.format(n=n))
    lines = {"AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
             "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "False"}
    stack = load_stack()
    stack.airflow_db_migrate(lines)
    stack.airflow_dags_reserialize(lines)

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | lines
    children = [subprocess.Popen([sys.executable, "-m", "airflow", "dags", "test", f"side_by_side_{n}", "2026-01-02"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 stdin=subprocess.DEVNULL) for n in (1, 2, 3)]
    outputs = [output_within(child, 300) for child in children]
    failed = [(n, out[-3000:]) for n, (child, out) in enumerate(zip(children, outputs, strict=True), 1)
              if child.returncode != 0]
    assert not failed, "runs started together failed:\n" + "\n".join(f"side_by_side_{n}:\n{out}" for n, out in failed)
