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
* Auth: ``SimpleAuthManager`` with ``[core] simple_auth_manager_all_admins`` makes ``GET /auth/token`` hand out an
  admin JWT without credentials (``api_fastapi/auth/managers/simple/routes/login.py``). With ``all_admins=False``
  an ``admin:ADMIN`` user whose password is in ``[core] simple_auth_manager_passwords_file`` logs in through
  ``POST /auth/token``.
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

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import psutil

from tests.support.stack import server_folder

T = TypeVar("T")

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
AIRFLOW_CLI = [sys.executable, "-m", "airflow"]


class AirflowServicesError(RuntimeError):
    """A service failed to start, a request failed, or a wait timed out; the message carries log tails."""


@dataclass
class ServiceProcess:
    """One long-running ``airflow <command>`` subprocess in its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    descendants: list[psutil.Process] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.popen.poll() is None


def free_loopback_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def from_iso(value: str) -> datetime:
    """A datetime from the API's ISO-8601 strings (``...Z`` included, which Python 3.10 does not parse)."""
    return datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)


def iso(moment: datetime | str) -> str:
    """An ISO-8601 string for a timezone-aware datetime (strings pass through)."""
    if isinstance(moment, str):
        return moment
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no timezone; Airflow needs aware datetimes")
    return moment.isoformat()


def postgres_bin_dir() -> Path | None:
    """The folder of PostgreSQL's server programs (``initdb``, ``postgres``), or None if not installed."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    installed = [p for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.parent.parent.name.isdigit()]
    return max(installed, key=lambda p: int(p.parent.parent.name)).parent if installed else None


class LocalPostgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1:<free port> (``trust`` auth, no fsync), database ``airflow``.

    As root, the cluster runs as the ``postgres`` OS user (PostgreSQL refuses to run as root); its data lives in
    its own temporary directory, which that user owns.
    """

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.port = 0
        self.dir: Path | None = None
        self.process: ServiceProcess | None = None
        bin_dir = postgres_bin_dir()
        missing = [m for m in ("psycopg2", "asyncpg") if importlib.util.find_spec(m) is None]
        if bin_dir is None or missing:
            raise AirflowServicesError(
                f"PostgreSQL metadata database needs Debian's postgresql (initdb found: {bin_dir is not None}) and "
                f"the Python drivers psycopg2-binary + asyncpg (missing: {missing}): apt-get install postgresql; "
                "pip install psycopg2-binary asyncpg -- or use metadata_db='sqlite' (no backfills)"
            )
        self.bin_dir = bin_dir
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            import pwd

            try:
                entry = pwd.getpwnam("postgres")
            except KeyError as error:
                raise AirflowServicesError(
                    "running as root needs the 'postgres' OS user (Debian's postgresql)"
                ) from error
            self._user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``airflow`` database (psycopg2; Airflow derives ``postgresql+asyncpg`` from it)."""
        return f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/airflow"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]],
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            **self._user,
        )

    def start(self, timeout: float = 60.0) -> None:
        """initdb, start ``postgres`` in its own process group, create the ``airflow`` database."""
        self.dir = server_folder("airflow-services-pg-", self._user)
        data = self.dir / "data"
        done = self._run(
            "initdb", "-D", str(data), "-U", "airflow", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"
        )
        if done.returncode != 0:
            raise AirflowServicesError(f"initdb failed:\n{done.stdout[-4000:]}")
        self.port = free_loopback_port()
        settings = {
            "listen_addresses": "127.0.0.1",
            "fsync": "off",  # a throwaway cluster: durability buys nothing
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
        }
        server_args = ["-D", str(data), "-p", str(self.port), "-k", str(self.dir)]
        for name, value in settings.items():
            server_args += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [str(self.bin_dir / "postgres"), *server_args],
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._user,
            )
        self.process = ServiceProcess(name="postgres", popen=popen, log_path=self.log_path)
        deadline = time.monotonic() + timeout
        while True:
            created = self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", "airflow")
            if created.returncode == 0:
                return
            if not self.process.running or time.monotonic() > deadline:
                raise AirflowServicesError(
                    f"postgres did not come up: {created.stdout}\n--- {self.log_path} ---\n{tail(self.log_path)}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> None:
        """Fast shutdown (SIGINT), SIGKILL of the process group after ``timeout``; removes the cluster."""
        if self.process is not None:
            _signal_group(self.process.popen.pid, signal.SIGINT)
            try:
                self.process.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.popen.pid, signal.SIGKILL)
                self.process.popen.wait(timeout=5)
            self.process = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class AirflowServices:
    """A throwaway Airflow 3 deployment (LocalExecutor, PostgreSQL or SQLite) on 127.0.0.1, as a context manager."""

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
        self.all_admins = all_admins
        self.dags_paused_at_creation = dags_paused_at_creation
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self.base_url = ""
        self.env: dict[str, str] = {}
        self.processes: list[ServiceProcess] = []
        self.timings: dict[str, float] = {}
        self._admin_password = secrets.token_urlsafe(12)
        self._token: str | None = None
        self._token_expires_at = 0.0
        self._client: httpx.Client | None = None

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
        for service in self.processes:
            service.descendants = _descendants(service.popen.pid)
            _signal_group(service.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for service in self.processes:
            try:
                service.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for service in self.processes:
            _signal_group(service.popen.pid, signal.SIGKILL)
            alive = [p for p in service.descendants if p.is_running()]
            for proc in alive:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(alive, timeout=5)
            try:
                service.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.processes = []
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _spawn(self, name: str, *args: str) -> ServiceProcess:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [*AIRFLOW_CLI, *args],
                env=self.env,
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = ServiceProcess(name=name, popen=popen, log_path=log_path)
        self.processes.append(service)
        return service

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

    # ------------------------------------------------------------------ REST API

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            raise AirflowServicesError("services are not started")
        return self._client

    @property
    def admin_password(self) -> str:
        """The ``admin`` user's password (``all_admins=False``), for a browser's login form."""
        return self._admin_password

    def token(self) -> str:
        """A JWT for the REST API, fetched again after 50 minutes (it lasts ``[api_auth] jwt_expiration_time``)."""
        if self._token and time.monotonic() < self._token_expires_at:
            return self._token
        if self.all_admins:
            response = self.client.get("/auth/token")
        else:
            response = self.client.post("/auth/token", json={"username": "admin", "password": self._admin_password})
        if response.status_code != 201:
            raise AirflowServicesError(f"token request failed: {response.status_code} {response.text}")
        self._token = str(response.json()["access_token"])
        self._token_expires_at = time.monotonic() + 3000  # the default expiration is 24 h
        return self._token

    def api(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        ok: Iterable[int] = (200, 201, 204),
        attempts: int = 10,
    ) -> Any:
        """Call ``/api/v2<path>`` with the bearer token; the decoded JSON body (``None`` if empty).

        Retried (``attempts`` in all): 503 on any method -- SQLite ``database is locked``, which e.g.
        ``POST /backfills`` maps to 503 after cleaning up (``api_fastapi/core_api/routes/public/backfills.py``) --
        and 500 on GET: Airflow 3.3.2 fails to serialise an asset event whose created run is still queued
        (``start_date`` NULL, apache/airflow#71360, fixed after 3.3.2 by #71379).
        """
        url = path if path.startswith("/api/") else f"/api/v2{path}"
        retry_on = {503, 500} if method.upper() == "GET" else {503}
        for attempt in range(1, attempts + 1):
            response = self.client.request(
                method, url, json=json, params=params, headers={"Authorization": f"Bearer {self.token()}"}
            )
            if response.status_code not in retry_on or attempt == attempts:
                break
            time.sleep(min(0.5 * attempt, 3.0))
        if response.status_code not in set(ok):
            raise AirflowServicesError(f"{method} {url} -> {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def health(self) -> dict[str, Any]:
        """GET /api/v2/monitor/health (no auth needed)."""
        return dict(self.client.get("/api/v2/monitor/health").json())

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

    def _raise_if_a_service_died(self) -> None:
        services = self.processes + ([self.postgres.process] if self.postgres and self.postgres.process else [])
        for service in services:
            if not service.running:
                raise AirflowServicesError(
                    f"airflow {service.name} exited with {service.popen.returncode}\n"
                    f"--- {service.log_path} ---\n{tail(service.log_path, 80)}"
                )

    # ------------------------------------------------------------------ DAGs and runs

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """GET /dags/{dag_id}, or None while the dag-processor has not serialised it."""
        response = self.client.get(f"/api/v2/dags/{dag_id}", headers={"Authorization": f"Bearer {self.token()}"})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise AirflowServicesError(f"GET dag {dag_id} -> {response.status_code}: {response.text[:2000]}")
        return dict(response.json())

    def wait_for_dag(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Until the dag-processor has parsed ``dag_id``; fails fast on an import error of any DAG file."""

        def parsed() -> dict[str, Any] | None:
            self._raise_if_a_service_died()
            dag = self.dag(dag_id)
            if dag is None and (errors := self.import_errors()):
                raise AirflowServicesError(f"DAG import errors: {json.dumps(errors, indent=1)[:4000]}")
            return dag

        return self._poll(parsed, timeout, lambda: f"DAG {dag_id} was not parsed from {self.dags_folder}")

    def import_errors(self) -> list[dict[str, Any]]:
        """GET /importErrors: DAG files that failed to parse."""
        return list(self.api("GET", "/importErrors")["import_errors"])

    def unpause(self, dag_id: str) -> dict[str, Any]:
        """PATCH /dags/{dag_id} is_paused=False."""
        return dict(self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False}))

    def pause(self, dag_id: str) -> dict[str, Any]:
        """PATCH /dags/{dag_id} is_paused=True."""
        return dict(self.api("PATCH", f"/dags/{dag_id}", {"is_paused": True}))

    def trigger(
        self, dag_id: str, conf: Mapping[str, Any] | None = None, logical_date: datetime | str | None = None
    ) -> dict[str, Any]:
        """POST /dags/{dag_id}/dagRuns: a manual run (``logical_date`` None = a run without one)."""
        body = {"logical_date": None if logical_date is None else iso(logical_date), "conf": dict(conf or {})}
        return dict(self.api("POST", f"/dags/{dag_id}/dagRuns", body))

    def dag_runs(self, dag_id: str, run_type: str | None = None) -> list[dict[str, Any]]:
        """All runs of ``dag_id`` (GET /dags/{dag_id}/dagRuns, paged), oldest first; optionally one run type
        (``backfill``, ``scheduled``, ``manual``, ``asset_triggered``)."""
        params = {"order_by": "id", **({"run_type": run_type} if run_type else {})}
        return self.paged(f"/dags/{dag_id}/dagRuns", "dag_runs", params)

    def paged(self, path: str, items_key: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every item of a GET collection endpoint (``limit``/``offset`` pages of 100)."""
        items: list[dict[str, Any]] = []
        while True:
            page = self.api("GET", path, params={**(params or {}), "limit": 100, "offset": len(items)})
            items.extend(page[items_key])
            if not page[items_key] or len(items) >= page["total_entries"]:
                return items

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

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """GET /dags/{dag_id}/dagRuns/{run_id}/taskInstances (paged)."""
        return self.paged(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", "task_instances")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task attempt's log as text, via the REST API (what the UI shows)."""
        body = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
        )
        lines = []
        for entry in body.get("content", []):
            if isinstance(entry, str):
                lines.append(entry)
                continue
            extra = {k: v for k, v in entry.items() if k not in ("timestamp", "event", "level", "logger")}
            lines.append(
                f"{entry.get('timestamp', '')} {entry.get('level', '')} {entry.get('event', '')}"
                + (f" {extra}" if extra else "")
            )
        return "\n".join(lines)

    # ------------------------------------------------------------------ backfills

    def create_backfill(
        self,
        dag_id: str,
        from_date: datetime | str,
        to_date: datetime | str,
        reprocess_behavior: str = "none",
        max_active_runs: int = 10,
        dag_run_conf: Mapping[str, Any] | None = None,
        run_backwards: bool = False,
    ) -> dict[str, Any]:
        """POST /backfills, the request the UI's Trigger -> Backfill dialog sends (``BackfillPostBody``).

        ``from_date``/``to_date`` are both inclusive logical dates; ``reprocess_behavior`` is ``none``,
        ``failed`` or ``completed``.
        """
        body = {
            "dag_id": dag_id,
            "from_date": iso(from_date),
            "to_date": iso(to_date),
            "run_backwards": run_backwards,
            "dag_run_conf": dict(dag_run_conf) if dag_run_conf is not None else None,
            "reprocess_behavior": reprocess_behavior,
            "max_active_runs": max_active_runs,
        }
        return dict(self.api("POST", "/backfills", body))

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

    def backfills(self, dag_id: str) -> list[dict[str, Any]]:
        """GET /backfills?dag_id=..., oldest first."""
        return self.paged("/backfills", "backfills", {"dag_id": dag_id})

    def backfill_runs(self, backfill: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Backfill-type runs whose logical date is in the backfill's (inclusive) range, oldest first.

        The REST API does not expose ``dag_run.backfill_id``; a run cleared by a later backfill becomes that
        backfill's run (same run id, ``run_type`` stays ``backfill``).
        """
        start, end = from_iso(backfill["from_date"]), from_iso(backfill["to_date"])
        return [
            r
            for r in self.dag_runs(backfill["dag_id"], run_type="backfill")
            if r["logical_date"] and start <= from_iso(r["logical_date"]) <= end
        ]

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

    # ------------------------------------------------------------------ assets

    def asset_events(self, **filters: Any) -> list[dict[str, Any]]:
        """GET /assets/events with filters such as ``source_dag_id``, ``source_run_id``, ``asset_id``."""
        return self.paged("/assets/events", "asset_events", {"order_by": "timestamp", **filters})

    def upstream_asset_events(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The asset events that triggered an asset-triggered run."""
        return list(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/upstreamAssetEvents")["asset_events"])

    # ------------------------------------------------------------------ diagnostics

    def diagnostics(self, dag_id: str | None = None, log_lines: int = 60) -> str:
        """Service log tails, and for ``dag_id`` its runs, task states and the logs of unsuccessful tasks."""
        parts = [f"AIRFLOW_HOME={self.home} service logs in {self.log_dir}"]
        services = self.processes + ([self.postgres.process] if self.postgres and self.postgres.process else [])
        for service in services:
            state = "running" if service.running else f"exited {service.popen.returncode}"
            parts.append(f"--- {service.name} ({state}) {service.log_path} ---\n{tail(service.log_path, log_lines)}")
        if dag_id:
            try:
                for run in self.dag_runs(dag_id)[-10:]:
                    parts.append(
                        f"run {run['dag_run_id']} type={run['run_type']} state={run['state']} "
                        f"logical_date={run['logical_date']} end={run['end_date']}"
                    )
                    for ti in self.task_instances(dag_id, run["dag_run_id"]):
                        parts.append(f"  task {ti['task_id']} state={ti['state']} try={ti['try_number']}")
                        if ti["state"] not in ("success", None) and ti["try_number"]:
                            log = self.task_log(dag_id, run["dag_run_id"], ti["task_id"], ti["try_number"])
                            parts.append("\n".join(log.splitlines()[-log_lines:]))
            except Exception as error:  # diagnostics must never hide the original failure
                parts.append(f"(could not list runs of {dag_id}: {error!r})")
        task_logs = sorted((self.home / "logs").glob("dag_id=*/**/*.log"), key=lambda p: p.stat().st_mtime)
        for path in task_logs[-3:]:
            parts.append(f"--- task log {path} ---\n{tail(path, log_lines)}")
        return "\n".join(parts)

    def _poll(
        self, check: Callable[[], T | None], timeout: float, describe: Callable[[], str], dag_id: str | None = None
    ) -> T:
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result is not None:
                return result
            if time.monotonic() > deadline:
                report = f"timed out after {timeout:.0f}s: {describe()}\n{self.diagnostics(dag_id)}"
                print(report, file=sys.stderr)
                raise AirflowServicesError(report)
            time.sleep(0.5)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group led by ``pid`` (the service was started with ``start_new_session``)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
