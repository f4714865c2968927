"""What the tests' child processes (``scripts/run_dag.py``, ``tests.integration.operator_child``) share."""

from __future__ import annotations

import atexit
import os
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
