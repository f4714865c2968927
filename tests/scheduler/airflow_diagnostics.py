"""The waits of a throwaway Airflow deployment (tests/scheduler/airflow_services.py) and what a failed one reports: its
services' log tails, a DAG's runs, task states and the logs of its unsuccessful tasks, the newest task logs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from tests.scheduler.airflow_rest import AirflowRestApi
from tests.scheduler.service_processes import AirflowServicesError, ServiceProcess, tail

T = TypeVar("T")


def diagnostics(rest: AirflowRestApi, home: Path, log_dir: Path, services: Sequence[ServiceProcess],
                dag_id: str | None = None, log_lines: int = 60) -> str:
    """Service log tails, and for ``dag_id`` its runs, task states and the logs of unsuccessful tasks."""
    parts = [f"AIRFLOW_HOME={home} service logs in {log_dir}"]
    for service in services:
        state = "running" if service.running else f"exited {service.popen.returncode}"
        parts.append(f"--- {service.name} ({state}) {service.log_path} ---\n{tail(service.log_path, log_lines)}")
    if dag_id:
        try:
            for run in rest.dag_runs(dag_id)[-10:]:
                parts.append(
                    f"run {run['dag_run_id']} type={run['run_type']} state={run['state']} "
                    f"logical_date={run['logical_date']} end={run['end_date']}"
                )
                for ti in rest.task_instances(dag_id, run["dag_run_id"]):
                    parts.append(f"  task {ti['task_id']} state={ti['state']} try={ti['try_number']}")
                    if ti["state"] not in ("success", None) and ti["try_number"]:
                        log = rest.task_log(dag_id, run["dag_run_id"], ti["task_id"], ti["try_number"])
                        parts.append("\n".join(log.splitlines()[-log_lines:]))
        except Exception as error:  # diagnostics must never hide the original failure
            parts.append(f"(could not list runs of {dag_id}: {error!r})")
    task_logs = sorted((home / "logs").glob("dag_id=*/**/*.log"), key=lambda p: p.stat().st_mtime)
    for path in task_logs[-3:]:
        parts.append(f"--- task log {path} ---\n{tail(path, log_lines)}")
    return "\n".join(parts)


def poll(check: Callable[[], T | None], timeout: float, describe: Callable[[], str]) -> T:
    """``check()`` every 0.5 s until it returns something; after ``timeout``, print and raise ``describe()``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            report = f"timed out after {timeout:.0f}s: {describe()}"
            print(report, file=sys.stderr)
            raise AirflowServicesError(report)
        time.sleep(0.5)
