"""What the tests' child processes (``scripts/run_dag.py``, ``tests.integration.operator_child``) share."""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import threading


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
