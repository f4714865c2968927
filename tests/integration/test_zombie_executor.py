"""An executor that outlives its attempt cannot undo a newer batch: upsert writes are fenced by the store's epoch.

On a cluster, a Spark task of an attempt whose Airflow task was killed can keep running and
write after a newer attempt committed a later batch. The upsert sink's writes are visible at
once, so such a late write would overwrite a newer row of the same key. Here the older attempt
runs in its own process with its (only) writer held back by the ``task_write`` failpoint (``pause``) until two
newer batches committed, then released: its write must abort, and the sink keep the newer row.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from confluent_kafka import Producer

from airflow_eo.core.failpoints import arm
from airflow_eo.sinks import MySqlUpsertSink
from tests.support import REPO, fork_server
from tests.support.kafka import create_topic
from tests.support.operator_harness import events_table, operator, rows, run

OLD_ATTEMPT = """
import sys
from airflow_eo.sinks import MySqlUpsertSink
from tests.support.operator_harness import operator, run
topic, table, pipeline = sys.argv[1:4]
run(operator(topic, MySqlUpsertSink(table=table, key_columns=["event_id"]), pipeline_id=pipeline), "run-1")
"""


def produce_version(bootstrap: str, topic: str, user_id: str) -> None:
    """The same key again with a new value: the newest batch's row must win."""
    producer = Producer({"bootstrap.servers": bootstrap})
    event = {"event_id": "the-key", "app_id": "app_00", "user_id": user_id, "ts": "2026-11-22T00:00:00.000Z"}
    producer.produce(topic, json.dumps(event).encode())
    assert producer.flush(30) == 0


def wait_for(path: Path, child: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if child.poll() is not None:
            raise AssertionError(f"the older attempt ended before its writer was held: {child.communicate()}")
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.2)


def test_a_held_back_executor_of_an_older_attempt_cannot_overwrite_a_newer_batch(bootstrap, mysql_kwargs,
                                                                                 topic_name, tmp_path):
    create_topic(bootstrap, topic_name, 1)
    table = events_table(mysql_kwargs)
    pipeline = f"zexec_{topic_name}"
    produce_version(bootstrap, topic_name, "u_old")
    env = {**os.environ, **arm("task_write=1*pause", directory=str(tmp_path))}
    older = fork_server.start(["-c", OLD_ATTEMPT, topic_name, table, pipeline], env, cwd=str(REPO),
                              stderr_to_stdout=True)
    try:
        wait_for(tmp_path / "held-task_write", older)  # planned, read, its writer waiting
        op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]), pipeline_id=pipeline)
        retry = run(op, "run-1")  # the newer attempt of the same run resumes batch 0 and commits it
        assert retry["resumed"] and retry["batch_id"] == 0 and retry["rows_out"] == 1
        produce_version(bootstrap, topic_name, "u_new")
        later = run(op, "run-2")
        assert later["batch_id"] == 1 and later["rows_out"] == 1
        assert rows(mysql_kwargs, f"SELECT user_id FROM {table}") == [("u_new",)]

        (tmp_path / "release-task_write").touch()  # the late write of the older attempt
        output, _ = older.communicate(timeout=300)
    finally:
        if older.poll() is None:
            older.kill()
    assert older.returncode != 0, output[-3000:]
    assert "FencedError" in output and "holds epoch 1 but a newer attempt took the pipeline" in output, output[-3000:]
    assert rows(mysql_kwargs, f"SELECT user_id FROM {table}") == [("u_new",)]
    states = rows(mysql_kwargs, "SELECT batch_id, state FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
                  (pipeline,))
    assert states == [(0, "committed"), (1, "committed")]
