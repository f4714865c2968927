"""Run DAGs of ``dags/`` once with ``dag.test()``: ``python scripts/run_dag.py DAG_ID[,DAG_ID...]
[LOGICAL_DATE[,LOGICAL_DATE...] [CONF_JSON]]``.

The same LOGICAL_DATE means the same DAG run (same run id): running it again is a
clear + re-run of that run. Several DAG ids, or several dates (each date's runs in turn), run one after the other in
this process (one Python, one DAG folder parse and one Spark session for all: their sinks must need the same Spark
conf). Exit code 0 when every run succeeded; the first that fails ends it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.children import build_only_the_newest_execution_api, dump_stacks_on_sigusr1, exit_now  # noqa: E402


def main() -> int:
    dump_stacks_on_sigusr1()
    build_only_the_newest_execution_api()
    if os.environ.get("AIRFLOW__OPENLINEAGE__TRANSPORT"):
        # OpenLineage sends DAG-run events from a process pool. Forked from this process once a Spark driver runs
        # in it (threads of py4j and of Spark's accumulator server), a worker can inherit a lock held by one of
        # them and wait on it for good, and the pool's join at exit with it. Workers forked from a fork server
        # (a fresh process, the listener's module loaded once) inherit none.
        multiprocessing.set_forkserver_preload(["airflow.providers.openlineage.plugins.listener"])
        multiprocessing.set_start_method("forkserver")
    dag_ids = sys.argv[1].split(",")
    logical_dates = ([datetime.fromisoformat(d) for d in sys.argv[2].split(",")] if len(sys.argv) > 2
                     else [datetime.now(timezone.utc)])
    run_conf = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    bag = DagBag(dag_folder=str(REPO / "dags"))
    missing = [dag_id for dag_id in dag_ids if dag_id not in bag.dags]
    if missing:
        print(f"no DAG {missing[0]!r}; import errors: {bag.import_errors}", file=sys.stderr)
        return 2
    for logical_date, dag_id in ((date, dag_id) for date in logical_dates for dag_id in dag_ids):
        dag = bag.dags[dag_id]
        # Airflow 3.3.1-3.3.2's dag.test() crashes after a successful run of a DAG with a deadline
        # (apache/airflow#73428: the alerts stay serialized dicts where their ids are expected). A dag.test() run has
        # no queued-at time, so our DAGRUN_QUEUED_AT deadlines are never created for it: leaving them out loses nothing.
        dag.deadline = None
        # run_after = logical_date makes the run id a function of LOGICAL_DATE (manual__<date>).
        run = dag.test(logical_date=logical_date, run_after=logical_date, run_conf=run_conf)
        print(f"dag run {dag_id} {run.run_id}: {run.state}")
        if str(run.state) not in ("success", "DagRunState.SUCCESS"):
            return 1
    return 0


if __name__ == "__main__":
    exit_now(main())
