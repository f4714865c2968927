"""Dead letters written by the executors survive a SIGKILL at their own step.

Each Spark task of a one-pass batch writes the bad records it finds into the dead-letter table (its own XA branch or
PostgreSQL prepared transaction, or its own fenced upsert transaction). The attempt is SIGKILLed right after a task
finished that write (``after_task_dead_letters``), then the same run is retried: the two-phase sinks showed nothing
before the commit point and the upsert sink's early dead letters are rewritten in place; at the end the sink holds
every good record once, the dead-letter table every bad record once, of the committed batch, and no prepared branch
is left. The PostgreSQL two-phase sink has its offset store on MySQL.

The table also refuses some good records, by a ``CHECK`` constraint no rule sees before the write: the first write
fails on them, probes find them, and the kill falls in the batch's second write (the one without them), so the
retry goes through the refusals again from the start. They end as dead letters too, and nowhere else.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from airflow_eo.core.failpoints import arm, register_process
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink, PostgresTwoPhaseSink
from examples.page_views import produce_page_views
from tests.support import REPO, fork_server
from tests.support.children import output_within
from tests.support.kafka import create_topic
from tests.support.operator_harness import events_table, operator, rows, run
from tests.support.page_views import our_prepared_branches
from tests.support.postgres import EVENTS_DDL, pg_rows, pg_table, prepared_gids

BAD_VALUES = [b"{not json %d" % i for i in range(40)]

ATTEMPT = """
import sys
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink, PostgresTwoPhaseSink
from tests.support.operator_harness import operator, run
topic, table, kind = sys.argv[1:4]
sink = {"xa": MySqlXaSink, "upsert": MySqlUpsertSink, "pg_two_phase": PostgresTwoPhaseSink}[kind](
    table=table, key_columns=["event_id"])
run(operator(topic, sink, on_bad_record="dead_letter", write_partitions=2), "run-1")
"""


SINKS = {"xa": MySqlXaSink, "upsert": MySqlUpsertSink, "pg_two_phase": PostgresTwoPhaseSink}


@pytest.mark.parametrize("kind", ["xa", "upsert", "pg_two_phase"])
def test_dead_letters_of_a_task_survive_a_sigkill_after_it_wrote_them(kind, bootstrap, mysql_kwargs, postgres_kwargs,
                                                                      topic_name, tmp_path):
    create_topic(bootstrap, topic_name, 2)
    good = produce_page_views(bootstrap, 400, topic=topic_name, raw_values=BAD_VALUES)
    pg = kind == "pg_two_phase"
    table = pg_table(postgres_kwargs, EVENTS_DDL, "events") if pg else events_table(mysql_kwargs)

    def sink_rows(sql: str, args: tuple = ()) -> list[tuple]:
        return pg_rows(postgres_kwargs, sql, args) if pg else rows(mysql_kwargs, sql, args)

    refused = good[::130]  # 4 of 400, spread over the tasks
    sink_rows(f"ALTER TABLE {table} ADD CONSTRAINT {table}_refused CHECK (event_id NOT IN "
              f"({', '.join(repr(e['event_id']) for e in refused)}))")

    def prepared(pipeline: str) -> list[str]:
        return prepared_gids(postgres_kwargs, pipeline) if pg else our_prepared_branches(mysql_kwargs, pipeline)

    pipeline = f"p_{topic_name}"
    env = {**os.environ, **arm("after_task_dead_letters=1*kill(driver)", directory=str(tmp_path))}
    with fork_server.start(["-c", ATTEMPT, topic_name, table, kind], env, cwd=str(REPO),
                           stderr_to_stdout=True) as child:
        register_process(str(tmp_path), "driver", child.pid)
        output = output_within(child, 600)
    assert child.returncode == -signal.SIGKILL, f"not killed at after_task_dead_letters:\n{output[-3000:]}"
    assert list(tmp_path.glob("fired-after_task_dead_letters*")), "the kill fell elsewhere"
    assert rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s", (pipeline,)) == [("planned",)]
    dead_count = "SELECT COUNT(*) FROM eo_dead_letter WHERE pipeline_id = %s"
    if kind != "upsert":  # the task's dead letters are prepared, invisible: nothing counts before the commit point
        branches = prepared(pipeline)
        assert [b for b in branches if ":-" in b], f"no prepared dead-letter branch: {branches}"
        assert sink_rows(dead_count, (pipeline,))[0][0] == 0
        assert sink_rows(f"SELECT COUNT(*) FROM {table}")[0][0] == 0
    else:  # replay-safe: what the task committed is there, and is rewritten in place by the retry
        assert sink_rows(dead_count, (pipeline,))[0][0] > 0

    sink = SINKS[kind](table=table, key_columns=["event_id"])
    retried = run(operator(topic_name, sink, on_bad_record="dead_letter", write_partitions=2), "run-1")
    assert retried["resumed"] and (retried["rows_out"], retried["dead_letters"]) == (
        400 - len(refused), len(BAD_VALUES) + len(refused))
    assert sorted(r[0] for r in sink_rows(f"SELECT event_id FROM {table}")) == sorted(
        e["event_id"] for e in good if e not in refused)
    dead = sink_rows("SELECT raw_value, batch_id, error FROM eo_dead_letter WHERE pipeline_id = %s", (pipeline,))
    assert sorted(bytes(d[0]) for d in dead if not d[2].startswith(f"table {table} refused it")) == sorted(BAD_VALUES)
    assert sorted(json.loads(bytes(d[0]))["event_id"] for d in dead if d[2].startswith(f"table {table} refused it")
                  ) == sorted(e["event_id"] for e in refused)
    assert {d[1] for d in dead} == {retried["batch_id"]}
    assert prepared(pipeline) == []
    assert rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s", (pipeline,)) == [("committed",)]
