"""The tests' Python children (``scripts/run_dag.py``, ``tests.support.operator_child``) forked from a process that
has already imported Airflow, pyspark and our package, instead of each starting a fresh Python: imports alone cost a
child ~3.3 s of CPU, and the suite starts a few hundred of them on two cores.

Python's own fork server (``multiprocessing``'s ``forkserver`` start method) does the forking: a fresh process, with
no thread and no JVM, that imports :data:`PRELOAD` once, then forks a child per request. A forked child is still a
process of its own, SIGKILLed for real by a failpoint or a test; its exit status comes back as a
:class:`subprocess.Popen`'s would (``-9`` for a SIGKILL).

What Python reads at import (Airflow's configuration, the interpreter's flags) is the server's, made with the
environment of the first child it forks: a child whose environment differs from that in anything but
:data:`READ_AT_RUN_TIME` is started as a plain process (a server is not restarted: it waits for every child it forked
to end first, a held one included). So is a child that cannot be forked (``AIRFLOW__OPENLINEAGE__TRANSPORT`` set:
its process pool wants a fork server of its own), and every child when ``EO_TEST_FORK_SERVER=0``.
``EO_TEST_FORK_SERVER_LOG=<file>``: each child's way (forked, or started and why) is appended there.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

# Imported once by the server. Nothing here may start a thread or a JVM at import (a fork copies only the forking
# thread: a lock held by another would stay held in every child).
PRELOAD = [
    "airflow.dag_processing.dagbag",
    "airflow.sdk",
    "airflow.api_fastapi.execution_api.app",
    "airflow.cli.cli_parser",
    "pyspark.sql",
    "tests.support.children",
    "tests.support.operator_harness",
    "airflow_eo.sinks",
    "airflow_eo.hooks.connected_sinks",
]

# Environment variables read when they are used, not at import: a child may differ from the server in these (a Spark
# session in the test's process sets PYSPARK_PYTHON, SPARK_BUFFER_SIZE and others in its environment).
READ_AT_RUN_TIME = re.compile(r"EO_.*|AIRFLOW_CONN_.*|AIRFLOW_EO_.*|PYTEST_.*|PYSPARK_.*|SPARK_.*")
FORK_REFUSED = ("AIRFLOW__OPENLINEAGE__TRANSPORT",)

_lock = threading.Lock()
_server_env: dict[str, str] | None = None


def start(args: list[str], env: Mapping[str, str], cwd: str | None = None,
          stderr_to_stdout: bool = False) -> Child:
    """``python *args`` (a script path, ``-m module`` or ``-c code``, then its arguments) as a child: forked from
    the fork server when its environment allows (see the module's docstring), else a plain process. Its stdout and
    stderr (or both in stdout) are text, collected by ``communicate``."""
    env = dict(env)  # a copy: ``os.environ`` itself is emptied while the server starts
    with _lock:
        why = _why_not_forked(args, env)
        _log(why or "forked", args)
        if why is None:
            return ForkedChild(args, env, cwd or os.getcwd(), stderr_to_stdout)
    return subprocess.Popen([sys.executable, *args], env=dict(env), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE, text=True)


def run(args: list[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
    """:func:`start` ``args`` and wait for its end, as :func:`subprocess.run` with ``capture_output`` and ``text``."""
    with start(args, env) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
    return subprocess.CompletedProcess(child.args, child.returncode or 0, out, err)


def _why_not_forked(args: list[str], env: Mapping[str, str]) -> str | None:
    """Why ``args`` with ``env`` is started as a plain process; None: it is forked (the server started if need be)."""
    global _server_env
    if os.environ.get("EO_TEST_FORK_SERVER") == "0":
        return "EO_TEST_FORK_SERVER=0"
    refused = [name for name in FORK_REFUSED if env.get(name)]
    if refused:
        return f"{refused[0]} set"
    if not (args[0] in ("-m", "-c") or args[0].endswith(".py")):
        return "not a module, a script or -c code"
    wanted = _at_import(env)
    if _server_env is None:
        multiprocessing.forkserver.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        try:  # the server is started with os.environ as it is now: the child's
            os.environ.clear()
            os.environ.update(env)
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server_env = wanted
    differ = sorted(k for k in wanted.keys() | _server_env.keys() if wanted.get(k) != _server_env.get(k))
    return f"environment read at import differs: {differ}" if differ else None


def _log(way: str, args: list[str]) -> None:
    log = os.environ.get("EO_TEST_FORK_SERVER_LOG")
    if log:
        with open(log, "a") as out:
            out.write(f"{os.getpid()}\t{way}\t{' '.join(args)[:120]!r}\n")


def _at_import(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not READ_AT_RUN_TIME.match(k)}


Child = Union[subprocess.Popen, "ForkedChild"]


class ForkedChild:
    """A child forked from the fork server, with the part of :class:`subprocess.Popen` the tests use."""

    def __init__(self, args: list[str], env: Mapping[str, str], cwd: str, stderr_to_stdout: bool = False) -> None:
        self.args = [sys.executable, *args]
        self.returncode: int | None = None
        self._output = tempfile.TemporaryDirectory(prefix="eo-child-")
        self._stdout = Path(self._output.name) / "stdout"
        self._stderr = self._stdout if stderr_to_stdout else Path(self._output.name) / "stderr"
        context = multiprocessing.get_context("forkserver")
        self._process = context.Process(target=_child_main, args=(args, dict(env), cwd, str(self._stdout),
                                                                   str(self._stderr)), name="eo-test-child")
        self._process.start()
        self.pid: int = self._process.pid  # type: ignore[assignment]

    def poll(self) -> int | None:
        if self.returncode is None and self._process.exitcode is not None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode  # type: ignore[return-value]

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        self.wait(timeout)
        out, err = (p.read_text(errors="replace") if p.exists() else "" for p in (self._stdout, self._stderr))
        self._process.close()
        self._output.cleanup()
        return out, None if self._stderr == self._stdout else err

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def __enter__(self) -> ForkedChild:
        return self

    def __exit__(self, *_: Any) -> None:
        if self.poll() is None:
            self.kill()
            self.wait()


def _child_main(args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """In the forked child: become ``python *args`` in ``cwd`` with ``env``, its output in the two files."""
    for fd, path in ((1, stdout), (2, stderr)):
        if fd == 2 and stderr == stdout:
            os.dup2(1, 2)
            continue
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    rest = [p for p in sys.path if p not in ("", cwd)]
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[:] = [cwd, *rest]
        run = lambda: runpy.run_module(args[1], run_name="__main__", alter_sys=True)  # noqa: E731
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[:] = ["", *rest]
        run = lambda: exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: E731
    else:
        script = str(Path(cwd, args[0]))
        sys.argv = [script, *args[1:]]
        sys.path[:] = [str(Path(script).parent), *rest]
        run = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
    from tests.support.children import exit_now

    code = 0
    try:
        run()
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter does with an uncaught exception: its traceback, exit 1
        traceback.print_exc()
        code = 1
    exit_now(code)
