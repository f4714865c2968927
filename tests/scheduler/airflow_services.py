"""A real Airflow 3 deployment on loopback for integration tests: api-server, scheduler, dag-processor, triggerer.

``AirflowServices`` creates a fresh ``AIRFLOW_HOME`` and metadata database, runs ``airflow db migrate`` and starts
the services as subprocesses (each in its own process group, output in ``<base_dir>/logs/<service>.log``). Tests
drive it through the public REST API (``/api/v2``) and the ``airflow`` CLI, as a user would::

    with AirflowServices(dags_folder, env={"AIRFLOW_CONN_MYSQL_DEFAULT": uri}) as airflow:
        airflow.wait_for_dag("my_dag")
        airflow.unpause("my_dag")
        backfill = airflow.create_backfill("my_dag", start, end)
        airflow.wait_for_runs("my_dag", [r["dag_run_id"] for r in airflow.backfill_runs(backfill)])

Choices, from the installed Airflow 3.3.2 sources:

* Metadata database: PostgreSQL by default (``LocalPostgres``: Debian's ``postgresql`` server programs, drivers
  ``psycopg2-binary`` + ``asyncpg``). Airflow 3 does accept SQLite with the LocalExecutor (no check left in
  ``configuration.py``; ``airflow standalone`` runs that pair) and ``metadata_db="sqlite"`` works for plain
  scheduling, but not for backfills: backfill creation (REST or CLI) races the scheduler's writes, the API answers
  503 "Backfill creation is not supported on SQLite under concurrent access. Please use PostgreSQL or MySQL"
  (``api_fastapi/core_api/routes/public/backfills.py``), and once its clean-up deleted runs the scheduler had
  loaded, which killed the scheduler (``StaleDataError``).
* Auth: ``SimpleAuthManager`` (tests/scheduler/airflow_rest.py).
* Everything binds 127.0.0.1: the api-server (``--host``, ``[api] host``), PostgreSQL (``listen_addresses``).
  Scheduler and triggerer run with ``--skip-serve-logs``: their log servers would bind ``0.0.0.0``
  (``utils/serve_logs/core.py``); task logs are local files that the api-server reads itself.
* Workers reach the execution API through ``[core] execution_api_server_url`` = ``<base_url>/execution/``. The
  api-server builds that app on its first request (~5 s of CPU here), longer than a task's 5 s client timeout
  (``[workers] execution_api_timeout``), so ``start()`` makes that first request itself.
* One backfill per DAG may be active (``models/backfill.py``) and the scheduler marks backfills completed only
  every 30 s (``_mark_backfills_complete`` in ``jobs/scheduler_job_runner.py``, not configurable): wait for the
  runs (``wait_for_runs``), and call ``wait_for_backfill`` only before the next backfill of the same DAG.
"""


from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

from tests.scheduler.airflow_diagnostics import diagnostics, poll
from tests.scheduler.airflow_rest import TERMINAL_RUN_STATES, AirflowRestApi, from_iso, iso
from tests.scheduler.metadata_postgres import LocalPostgres
from tests.scheduler.service_processes import (
    AirflowServicesError,
    ServiceProcess,
    free_loopback_port,
    raise_if_a_service_died,
    signal_group,
    spawn_service,
    stop_services,
)

T = TypeVar("T")

AIRFLOW_CLI = [sys.executable, "-m", "airflow"]


class AirflowServices(AirflowRestApi):
    """A throwaway Airflow 3 deployment (LocalExecutor, PostgreSQL or SQLite) on 127.0.0.1, as a context manager.

    Its REST calls are :class:`~tests.scheduler.airflow_rest.AirflowRestApi`'s; here: the processes, the waits and
    what a failed wait reports.
    """

    def __init__(
        self,
        dags_folder: Path | str,
        env: Mapping[str, str] | None = None,
        *,
        base_dir: Path | str | None = None,
        triggerer: bool = False,
        parallelism: int = 2,
        metadata_db: str = "postgres",
        all_admins: bool = True,
        dags_paused_at_creation: bool = True,
        startup_timeout: float = 120.0,
        stop_timeout: float = 20.0,
    ) -> None:
        """Configure (nothing starts before ``start()``/``__enter__``).

        :param dags_folder: folder the dag-processor parses (``[core] dags_folder``).
        :param env: extra environment for every process (``AIRFLOW_CONN_*``, ``AIRFLOW__SECTION__KEY``, ...);
            applied last, so it can override the defaults below. ``AIRFLOW*`` variables of the calling process
            are *not* inherited, so a sourced ``.stack/env`` cannot leak into the deployment.
        :param base_dir: where AIRFLOW_HOME (task logs, SQLite file) and the service logs go; a new temporary
            directory (removed at exit) if omitted, else kept for inspection. A PostgreSQL cluster lives in its own
            temporary directory, always removed at exit.
        :param triggerer: also run ``airflow triggerer`` (deferrable operators/sensors).
        :param metadata_db: ``postgres`` (a private cluster, see ``LocalPostgres``) or ``sqlite`` (a file in
            AIRFLOW_HOME; fine for plain scheduling, NOT for backfills: see the module docstring).
        :param all_admins: ``[core] simple_auth_manager_all_admins``; if False, ``token()`` logs in as ``admin``.
        """
        if metadata_db not in ("postgres", "sqlite"):
            raise ValueError(f"metadata_db must be 'postgres' or 'sqlite', not {metadata_db!r}")
        super().__init__(all_admins)
        self.dags_folder = Path(dags_folder).resolve()
        self.extra_env = dict(env or {})
        self._owns_base_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="airflow-services-")).resolve()
        self.home = self.base_dir / "airflow_home"
        self.log_dir = self.base_dir / "logs"
        self.metadata_db = metadata_db
        self.postgres: LocalPostgres | None = None
        self.with_triggerer = triggerer
        self.parallelism = parallelism
        self.dags_paused_at_creation = dags_paused_at_creation
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self.base_url = ""
        self.env: dict[str, str] = {}
        self.processes: list[ServiceProcess] = []
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> AirflowServices:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def build_env(self) -> dict[str, str]:
        """The environment of every Airflow process of this deployment."""
        inherited = {k: v for k, v in os.environ.items() if not k.lstrip("_").startswith("AIRFLOW")}
        from cryptography.fernet import Fernet

        airflow_env = {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(self.dags_paused_at_creation),
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            # Re-serialise changed DAG files (and revalidate the api-server's DAG cache) within seconds.
            "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "5",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sql_alchemy_conn(),
            # Auth: with all_admins every request is admin and GET /auth/token needs no credentials.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": str(self.all_admins),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:ADMIN",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            # One JWT/session secret for all processes (the scheduler signs task tokens the api-server checks).
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__EXPOSE_STACKTRACE": "True",
            # Workers (task supervisors) report to this api-server's execution API.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # New/changed DAG files are listed every ~2 s and parsed at most every 5 s.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "10",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
            # Unused with --skip-serve-logs; free ports anyway, so that no fallback reaches another deployment.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_loopback_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_loopback_port()),
            "PYTHONUNBUFFERED": "1",
        }
        return {**inherited, **airflow_env, **self.extra_env}

    def sql_alchemy_conn(self) -> str:
        """``[database] sql_alchemy_conn`` of this deployment."""
        if self.postgres is not None:
            return self.postgres.url
        # Airflow switches SQLite to WAL itself (utils/orm_event_handlers.py); a 30 s busy timeout (pysqlite's
        # default is 5 s) lets a writer wait out the other processes' writes.
        return f"sqlite:///{self.home / 'airflow.db'}?timeout=30"

    def start(self) -> None:
        """Fresh metadata database and ``db migrate``, start the services, wait until all report healthy."""
        begin = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.dags_folder.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({"admin": self._admin_password}) + "\n")
        if self.metadata_db == "postgres":
            self.postgres = LocalPostgres(self.log_dir / "postgres.log")
            self.postgres.start()
            self.timings["postgres_start_s"] = time.monotonic() - begin
        self.port = free_loopback_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = self.build_env()

        migrating = time.monotonic()
        migrated = self.airflow_cli("db", "migrate", timeout=180, log_name="db-migrate")
        if migrated.returncode != 0:
            raise AirflowServicesError(f"airflow db migrate failed:\n{migrated.stdout[-4000:]}")
        self.timings["db_migrate_s"] = time.monotonic() - migrating

        started = time.monotonic()
        self._spawn("api-server", "api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1")
        self._spawn("scheduler", "scheduler", "--skip-serve-logs")
        self._spawn("dag-processor", "dag-processor")
        if self.with_triggerer:
            self._spawn("triggerer", "triggerer", "--skip-serve-logs")
        self._client = httpx.Client(base_url=self.base_url, timeout=30.0)
        self._poll(self._api_server_answers, self.startup_timeout, lambda: "the api-server does not answer")
        self.timings["api_server_up_s"] = time.monotonic() - started
        # The first execution-API request builds that app (~5 s of CPU): make it before any task does, while the
        # scheduler and the dag-processor are still starting.
        self.client.get("/execution/health", timeout=120).raise_for_status()
        self.timings["execution_api_warm_s"] = time.monotonic() - started
        self.wait_until_healthy(self.startup_timeout)
        self.timings["services_to_healthy_s"] = time.monotonic() - started
        self.timings["start_total_s"] = time.monotonic() - begin

    def _api_server_answers(self) -> bool | None:
        self._raise_if_a_service_died()
        try:
            return self.client.get("/api/v2/monitor/health").status_code == 200 or None
        except httpx.TransportError:
            return None

    def stop(self) -> None:
        """SIGTERM every service's process group (and stray descendants), SIGKILL what is left after a grace."""
        if self._client is not None:
            self._client.close()
            self._client = None
        stop_services(self.processes, self.stop_timeout)
        self.processes = []
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _spawn(self, name: str, *args: str) -> ServiceProcess:
        service = spawn_service(name, [*AIRFLOW_CLI, *args], self.env, self.base_dir, self.log_dir)
        service.args = args
        self.processes.append(service)
        return service

    def service_log(self, name: str) -> Path:
        """The log file of a service (its output; a service started again writes on in it)."""
        return next(s.log_path for s in self.processes if s.name == name)

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL a service's process group, as a crash would, and start it again (its log goes on in the same
        file); returns once every service reports healthy."""
        service = next(s for s in self.processes if s.name == name)
        signal_group(service.popen.pid, signal.SIGKILL)
        service.popen.wait(timeout=30)
        self.processes.remove(service)
        self._spawn(name, *service.args)
        self.wait_until_healthy(self.startup_timeout)

    def airflow_cli(
        self, *args: str, timeout: float = 120, log_name: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` in this deployment's environment; output (stdout+stderr) also goes to a log."""
        done = subprocess.run(
            [*AIRFLOW_CLI, *args],
            env=self.env,
            cwd=self.base_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        name = log_name or "cli-" + "-".join(a for a in args[:2] if not a.startswith("-"))
        with open(self.log_dir / f"{name}.log", "a") as log_file:
            log_file.write(f"$ airflow {' '.join(args)}\n{done.stdout}\n[exit {done.returncode}]\n")
        return done

    # ------------------------------------------------------------------ waits

    def wait_until_healthy(self, timeout: float) -> dict[str, Any]:
        """Until metadatabase, scheduler, dag-processor (and triggerer if started) report healthy."""
        components = ["metadatabase", "scheduler", "dag_processor"] + (["triggerer"] if self.with_triggerer else [])
        last: dict[str, Any] = {}

        def healthy() -> dict[str, Any] | None:
            nonlocal last
            self._raise_if_a_service_died()
            try:
                last = self.health()
            except (httpx.TransportError, ValueError):
                return None
            return last if all((last.get(c) or {}).get("status") == "healthy" for c in components) else None

        return self._poll(healthy, timeout, lambda: f"services not healthy; last health: {last}")

    def _services(self) -> list[ServiceProcess]:
        return self.processes + ([self.postgres.process] if self.postgres and self.postgres.process else [])

    def _raise_if_a_service_died(self) -> None:
        raise_if_a_service_died(self._services())

    def wait_for_dag(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Until the dag-processor has parsed ``dag_id``; fails fast on an import error of any DAG file."""

        def parsed() -> dict[str, Any] | None:
            self._raise_if_a_service_died()
            dag = self.dag(dag_id)
            if dag is None and (errors := self.import_errors()):
                raise AirflowServicesError(f"DAG import errors: {json.dumps(errors, indent=1)[:4000]}")
            return dag

        return self._poll(parsed, timeout, lambda: f"DAG {dag_id} was not parsed from {self.dags_folder}")

    def wait_for_runs(
        self,
        dag_id: str,
        run_ids: Iterable[str] | None = None,
        count: int | None = None,
        timeout: float = 120.0,
        *,
        run_type: str | None = None,
        ended_after: datetime | None = None,
    ) -> dict[str, str]:
        """Until the given runs (or at least ``count`` runs, all of them finished) are success/failed.

        ``ended_after`` (aware datetime) also requires each run's ``end_date`` to be later, which is how a
        cleared-and-rerun run is told from its earlier success. Returns ``{run_id: state}`` of the runs waited
        for; on timeout raises with run/task states and service and task log tails.
        """
        wanted = list(run_ids) if run_ids is not None else None
        if wanted is None and count is None:
            raise ValueError("give run_ids or count")

        def finished(run: dict[str, Any]) -> bool:
            if run["state"] not in TERMINAL_RUN_STATES:
                return False
            return ended_after is None or (run["end_date"] is not None and from_iso(run["end_date"]) > ended_after)

        def done() -> dict[str, str] | None:
            self._raise_if_a_service_died()
            runs = self.dag_runs(dag_id, run_type)
            if wanted is not None:
                by_id = {r["dag_run_id"]: r for r in runs}
                selected = [by_id[i] for i in wanted if i in by_id]
                if len(selected) < len(wanted):
                    return None
            else:
                selected = runs
                if len(selected) < (count or 0):
                    return None
            if all(finished(r) for r in selected):
                return {r["dag_run_id"]: r["state"] for r in selected}
            return None

        return self._poll(done, timeout, lambda: f"runs of {dag_id} not finished", dag_id=dag_id)

    def cli_backfill(
        self,
        dag_id: str,
        from_date: datetime | str,
        to_date: datetime | str,
        reprocess_behavior: str = "none",
        max_active_runs: int = 10,
        dag_run_conf: Mapping[str, Any] | None = None,
        run_backwards: bool = False,
        attempts: int = 3,
    ) -> dict[str, Any]:
        """``airflow backfill create ...`` in this deployment's environment; returns the backfill it created.

        A ``database is locked`` failure (the CLI writes SQLite next to the running scheduler) is retried.
        """
        args = ["backfill", "create", "--dag-id", dag_id, "--from-date", iso(from_date), "--to-date", iso(to_date)]
        args += ["--reprocess-behavior", reprocess_behavior, "--max-active-runs", str(max_active_runs)]
        if dag_run_conf is not None:
            args += ["--dag-run-conf", json.dumps(dict(dag_run_conf))]
        if run_backwards:
            args.append("--run-backwards")
        known = {b["id"] for b in self.backfills(dag_id)}
        for attempt in range(1, attempts + 1):
            done = self.airflow_cli(*args, timeout=180, log_name="cli-backfill")
            if done.returncode == 0:
                break
            if "database is locked" not in done.stdout or attempt == attempts:
                raise AirflowServicesError(f"airflow {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}")
            time.sleep(attempt)
        created = [b for b in self.backfills(dag_id) if b["id"] not in known]
        if not created:
            raise AirflowServicesError(f"airflow backfill create made no backfill:\n{done.stdout[-4000:]}")
        return max(created, key=lambda b: b["id"])

    def wait_for_backfill(self, backfill_id: int, timeout: float = 120.0) -> dict[str, Any]:
        """Until the scheduler marks the backfill completed; returns the backfill.

        That happens up to 30 s after its last run finished (the scheduler checks every 30 s): wait for the runs
        instead unless the next backfill of the same DAG needs this one completed.
        """
        last: dict[str, Any] = dict(self.api("GET", f"/backfills/{backfill_id}"))

        def completed() -> dict[str, Any] | None:
            nonlocal last
            self._raise_if_a_service_died()
            last = dict(self.api("GET", f"/backfills/{backfill_id}"))
            return last if last.get("completed_at") else None

        return self._poll(completed, timeout, lambda: f"backfill {backfill_id} not completed: {last}", last["dag_id"])

    def wait_for_the_executor_event(self, dag_id: str, run_id: str, task_id: str, try_number: int,
                                    timeout: float = 120) -> None:
        """Until the scheduler has taken the executor's event for this attempt's worker exit (its log says so).

        A human-in-the-loop answer that arrives before that event re-queues the task, and Airflow 3.3.2's scheduler
        then reads the stale "success" of the paused worker as a queued task that finished: it fails the task. A person
        answers seconds later; a test answering at once must wait for the same thing a person's delay gives."""
        key = f"TaskInstanceKey(dag_id='{dag_id}', task_id='{task_id}', run_id='{run_id}', try_number={try_number},"
        scheduler_log = self.log_dir / "scheduler.log"

        def taken() -> bool | None:
            text = scheduler_log.read_text(errors="replace") if scheduler_log.exists() else ""
            said = any("Received executor event" in line and key in line for line in text.splitlines())
            return True if said else None

        self._poll(taken, timeout, lambda: f"the scheduler took no executor event for {key}", dag_id)

    # ------------------------------------------------------------------ diagnostics

    def diagnostics(self, dag_id: str | None = None, log_lines: int = 60) -> str:
        """Service log tails, and for ``dag_id`` its runs, task states and the logs of unsuccessful tasks."""
        return diagnostics(self, self.home, self.log_dir, self._services(), dag_id, log_lines)

    def _poll(
        self, check: Callable[[], T | None], timeout: float, describe: Callable[[], str], dag_id: str | None = None
    ) -> T:
        return poll(check, timeout, lambda: f"{describe()}\n{self.diagnostics(dag_id)}")
