"""The Airflow metadata database that ``.stack/env`` points to (SQLite under ``.stack/airflow``): migrated, and the
DAG folder written into it, so that ``airflow dags test`` works right after ``up``, several at once included."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from stack_services.processes import die


def airflow_cli(lines: dict[str, str], *args: str) -> None:
    """``airflow *args`` with the environment of ``.stack/env``; its output (which may name the database URL) is
    shown only on failure, with any password masked."""
    done = subprocess.run([sys.executable, "-m", "airflow", *args], env={**os.environ, **lines},
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", (done.stdout + done.stderr)[-3000:])
        die(f"airflow {' '.join(args)} failed (exit {done.returncode}); last output:\n{tail}")


def airflow_db_migrate(lines: dict[str, str]) -> None:
    """``airflow db migrate`` (idempotent: a no-op when migrated)."""
    airflow_cli(lines, "db", "migrate")
    print(f"stack: Airflow metadata database migrated (AIRFLOW_HOME={lines['AIRFLOW_HOME']})")


def airflow_dags_reserialize(lines: dict[str, str]) -> None:
    """``airflow dags reserialize``: write every DAG of the DAG folder into the metadata database once, now.

    Each ``airflow dags test`` (and ``dag.test()``) writes the whole folder's DAGs before its run. On a database
    that has never seen them, runs started side by side insert the same rows and all but one die with an
    IntegrityError before their batch starts (seen in a fresh clone's first ``make demo``); once the rows exist,
    a run only compares them. A few seconds.
    """
    airflow_cli(lines, "dags", "reserialize")
    print(f"stack: the DAGs of {lines['AIRFLOW__CORE__DAGS_FOLDER']} written to the metadata database")
