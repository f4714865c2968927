"""Run the micro-batch operator once in this process (a child the crash tests SIGKILL at a failpoint):
``python -m tests.support.operator_child '<json>'`` with ``topic``, ``pipeline_id``, ``run_id``, ``sink`` (a
registered kind's name and its options), and optional ``transform``,
``offset_store_conn_id``, ``options`` (more operator options) and ``interval`` (``[start, end]`` in ISO 8601: the
run's data interval, for ``mode="interval"``)."""

from __future__ import annotations

import json
import sys
from datetime import datetime

from airflow_eo.sinks import SINK_KINDS
from tests.support.children import dump_stacks_on_sigusr1, exit_now
from tests.support.operator_harness import operator, run


def main() -> int:
    dump_stacks_on_sigusr1()
    job = json.loads(sys.argv[1])
    sink = dict(job["sink"])
    spec = SINK_KINDS[sink.pop("kind")](**sink)
    options = {k: job[k] for k in ("transform", "offset_store_conn_id") if job.get(k)}
    options.update(job.get("options") or {})  # other operator options (key_format, schema, on_bad_record, ..)
    interval = job.get("interval")
    summary = run(operator(job["topic"], spec, pipeline_id=job["pipeline_id"], **options), run_id=job["run_id"],
                  interval=None if interval is None else (datetime.fromisoformat(interval[0]),
                                                          datetime.fromisoformat(interval[1])))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    exit_now(main())
