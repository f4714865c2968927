"""Run the micro-batch operator once in this process (a child the crash tests SIGKILL at a failpoint):
``python -m tests.support.operator_child '<json>'``, the job :func:`tests.support.operator_harness.run_job` runs."""

from __future__ import annotations

import json
import sys

from tests.support.children import dump_stacks_on_sigusr1, exit_now
from tests.support.operator_harness import run_job


def main() -> int:
    dump_stacks_on_sigusr1()
    print(json.dumps(run_job(json.loads(sys.argv[1]))))
    return 0


if __name__ == "__main__":
    exit_now(main())
