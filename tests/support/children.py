"""What the tests' child processes (``scripts/run_dag.py``, ``tests.support.operator_child``) share."""

from __future__ import annotations

import atexit
import faulthandler
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from tests.support.fork_server import Child


def dump_stacks_on_sigusr1() -> None:
    """A child's Python stacks go to its stderr on SIGUSR1: what :func:`diagnose_hang` asks of a child that hangs."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def build_only_the_newest_execution_api() -> None:
    """A ``dag.test()`` child serves Airflow's task execution API in-process, and Cadwyn builds its routes for every
    API version Airflow keeps (9 in Airflow 3.3): ~4.6 s of CPU per child here, a third of an empty run. The child's
    own client speaks only the newest version (``airflow.sdk.api.client.API_VERSION``), so the children build only
    that one; what the tasks send and receive is unchanged. The tests start ~250 such children."""
    from airflow.api_fastapi.execution_api import versions
    from airflow.api_fastapi.execution_api.routes import execution_api_router
    from airflow.sdk.api.client import API_VERSION
    from cadwyn import HeadVersion, Version, VersionBundle
    from cadwyn.route_generation import _DELETED_ROUTE_TAG

    newest = versions.bundle.versions[0].value
    assert newest == API_VERSION, f"the execution API's newest version {newest} is not the client's {API_VERSION}"
    versions.bundle = VersionBundle(HeadVersion(), Version(newest))
    # Routes that only older versions serve (Cadwyn refuses them when no older version restores them).
    execution_api_router.routes[:] = [r for r in execution_api_router.routes
                                      if _DELETED_ROUTE_TAG not in getattr(r, "tags", ())]


def exit_now(code: int) -> None:
    """Exit with ``code`` once the run is over, without the interpreter's teardown of every module Airflow and
    pyspark loaded: that teardown alone took ~2.5 s of CPU a process here, and the tests start ~150 of these.
    Threads still working (a lineage emitter, say) are waited for, and the atexit handlers run, as at a normal
    exit."""
    threading._shutdown()  # type: ignore[attr-defined]  # what a normal exit does first: stop executors, join
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def why(child: subprocess.CompletedProcess, limit: int = 6000) -> str:
    """What a failed child printed that says why, for an assertion's message: the Python tracebacks and error
    lines (a Spark task's own traceback sits at the top of a long Java trace, where a tail never reaches), then
    the last lines. Java frames (``\\tat ...``) are left out."""
    lines = [line for line in (child.stderr or "").splitlines() if not line.lstrip().startswith("at ")]
    salient = [i for i, line in enumerate(lines) if line.startswith("Traceback") or _ERROR.search(line)]
    picked: list[str] = []
    for i in salient:
        picked.extend(lines[i:i + 12] if lines[i].startswith("Traceback") else lines[i:i + 1])
    head = "\n".join(dict.fromkeys(picked))[: limit // 2]
    tail = "\n".join(lines)[-(limit // 2):]
    return f"exit {child.returncode}; errors:\n{head}\n... last lines:\n{tail}"


_ERROR = re.compile(r"(Error|Exception|Caused by)[:\s]")


def output_within(child: Child, timeout: float, python_stacks: bool = False) -> str:
    """The child's output (its stdout, with its stderr when merged into it) once it ends (see
    :func:`communicate_within`)."""
    return communicate_within(child, timeout, python_stacks)[0]


def communicate_within(child: Child, timeout: float, python_stacks: bool = False) -> tuple[str, str]:
    """The child's stdout and stderr once it ends. Still running after ``timeout`` seconds: an AssertionError with
    what it waits for (:func:`diagnose_hang`; ``python_stacks`` when the child called :func:`dump_stacks_on_sigusr1`)
    and its output, the child and its JVMs killed (they hold its output open: a wait would last until pytest's own
    timeout, showing nothing)."""
    try:
        out, err = child.communicate(timeout=timeout)
        return out or "", err or ""
    except subprocess.TimeoutExpired:
        waiting = diagnose_hang(child, python_stacks)
        kill_family(child)
        out, err = child.communicate()
        raise AssertionError(f"{child.args} still running after {timeout} s; {waiting}\nits output's end:\n"
                             f"{(out or '')[-20000:]}{(err or '')[-20000:]}") from None


def diagnose_hang(child: Child, python_stacks: bool = True) -> str:
    """What a child that hangs is waiting for, before it is killed: its Python stacks (SIGUSR1, when it called
    :func:`dump_stacks_on_sigusr1`: SIGUSR1 ends any other) and its JVMs' thread dumps (SIGQUIT) go to its own
    output; the databases' sessions that are not idle (a lock wait shows there) are returned."""
    family = _family(child)
    if not family:
        return "the child is gone"
    for process in family:
        try:
            if process.pid == child.pid:
                if python_stacks:
                    process.send_signal(signal.SIGUSR1)
            elif process.name() == "java":
                process.send_signal(signal.SIGQUIT)
        except psutil.NoSuchProcess:
            pass
    time.sleep(3)
    return "\n".join([f"processes: {[(p.pid, _name(p)) for p in family]}", _postgres_sessions(), _mysql_sessions()])


def kill_family(child: Child) -> None:
    """SIGKILL the child and every process under it (its Spark JVM keeps the child's output pipes open)."""
    for process in _family(child):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _family(child: Child) -> list[psutil.Process]:
    """The child and every process under it; none when it is gone."""
    try:
        parent = psutil.Process(child.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return "gone"


def _postgres_sessions() -> str:
    if "AIRFLOW_CONN_POSTGRES_DEFAULT" not in os.environ:
        return "postgres: no stack"
    try:
        import psycopg

        from airflow_eo.hooks.postgres import EoPostgresHook

        kwargs = EoPostgresHook("postgres_default").get_connect_kwargs()
        with psycopg.connect(**{**kwargs, "connect_timeout": 5}, autocommit=True) as conn:
            rows: list[Any] = conn.execute(
                "SELECT pid, state, wait_event_type, wait_event, now() - xact_start, left(query, 200) "
                "FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database() "
                "AND state IS DISTINCT FROM 'idle'").fetchall()
            prepared = conn.execute("SELECT gid, prepared FROM pg_prepared_xacts").fetchall()
        return f"postgres sessions: {rows}\npostgres prepared ({len(prepared)}): {prepared[:40]}"
    except Exception as exc:  # a diagnosis must not hide the hang it diagnoses
        return f"postgres: {exc}"


def _mysql_sessions() -> str:
    if "AIRFLOW_CONN_MYSQL_DEFAULT" not in os.environ:
        return "mysql: no stack"
    try:
        import pymysql

        from airflow_eo.hooks.mysql import EoMySqlHook

        kwargs = EoMySqlHook("mysql_default").get_connect_kwargs()
        with pymysql.connect(**{**kwargs, "connect_timeout": 5}) as conn, conn.cursor() as cur:
            cur.execute("SELECT id, command, time, state, left(info, 200) FROM information_schema.processlist "
                        "WHERE command <> 'Sleep' AND id <> connection_id()")
            rows = cur.fetchall()
            cur.execute("XA RECOVER")
            prepared = cur.fetchall()
        return f"mysql sessions: {rows}\nmysql prepared ({len(prepared)}): {prepared[:40]}"
    except Exception as exc:
        return f"mysql: {exc}"
