"""The metadata database of a throwaway Airflow deployment (tests/scheduler/airflow_services.py): a PostgreSQL
cluster of its own, from Debian's server programs (backfills refuse SQLite: see that module's docstring)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.scheduler.service_processes import (
    AirflowServicesError,
    ServiceProcess,
    free_loopback_port,
    signal_group,
    tail,
)
from tests.support.stack import server_folder


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
            signal_group(self.process.popen.pid, signal.SIGINT)
            try:
                self.process.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                signal_group(self.process.popen.pid, signal.SIGKILL)
                self.process.popen.wait(timeout=5)
            self.process = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

