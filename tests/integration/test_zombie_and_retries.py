"""Overlapping attempts (zombies) and Spark task retries after XA PREPARE."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_eo.core.batch import BatchSummary
from airflow_eo.core.errors import FencedError
from airflow_eo.core.failpoints import FAILPOINT_DIR_ENV
from airflow_eo.core.protocol import run_batch
from airflow_eo.sinks import MySqlXaSink
from examples.page_views import count_per_app, produce_page_views
from tests.support.kafka import create_topic
from tests.support.operator_harness import adapters, counts_table, request, rows
from tests.support.page_views import (
    XA_PIPELINE,
    assert_exactly_once,
    our_prepared_branches,
    reset,
    run_dag,
    topic_truth,
)


class EngineThatOutlivesItsAttempt:
    """The real engine; after its Spark work (branches prepared) a newer attempt runs to the end."""

    def __init__(self, real: Any, newer_attempt) -> None:
        self.real, self.newer_attempt = real, newer_attempt
        self.newer_summary: BatchSummary | None = None

    def check(self) -> None:
        self.real.check()

    def execute(self, batch, sink):
        result = self.real.execute(batch, sink)
        assert result.xids, "the old attempt must hold prepared branches when the newer one starts"
        self.newer_summary = self.newer_attempt()
        return result


@pytest.mark.parametrize("newer_run", ["same run (Airflow retry)", "another run"])
def test_only_the_newer_of_two_overlapping_attempts_commits(newer_run, bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 3)
    produce_page_views(bootstrap, 400, topic=topic_name)
    table = counts_table(mysql_kwargs)
    sink = MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"})
    pipeline = f"zombie_{topic_name}"
    newer_run_id = "run-1" if newer_run.startswith("same") else "run-2"

    def newer_attempt() -> BatchSummary:
        return run_batch(request(pipeline, topic_name, newer_run_id),
                         **adapters(sink, pipeline, transform=count_per_app))

    old = adapters(sink, pipeline, transform=count_per_app)
    old["engine"] = zombie = EngineThatOutlivesItsAttempt(old["engine"], newer_attempt)
    with pytest.raises(FencedError, match="newer attempt"):
        run_batch(request(pipeline, topic_name, "run-1"), **old)

    truth = topic_truth(bootstrap, topic_name)
    assert dict(rows(mysql_kwargs, f"SELECT app_id, pv FROM {table}")) == truth.pv_per_app
    assert zombie.newer_summary is not None and zombie.newer_summary.records_in == 400
    assert our_prepared_branches(mysql_kwargs, pipeline) == []
    committed = dict(rows(mysql_kwargs, "SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                          (pipeline,)))
    assert committed == truth.end_offsets
    states = [r[0] for r in rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
                                 (pipeline,))]
    assert states == (["committed"] if newer_run_id == "run-1" else ["aborted", "committed"])


def test_spark_task_retried_after_xa_prepare_does_not_wait_on_its_own_locks(bootstrap, mysql_kwargs, airflow_db,
                                                                           tmp_path):
    reset(mysql_kwargs, XA_PIPELINE)
    produce_page_views(bootstrap, 2000)
    # local[2,4]: Spark retries a failed task up to 4 times (plain local[*] never retries).
    done = run_dag("page_views_xa", fault="after_task_prepare=1*panic",
                   env={"AIRFLOW_EO_SPARK_MASTER": "local[2,4]", FAILPOINT_DIR_ENV: str(tmp_path)})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "failpoint after_task_prepare: injected failure" in output  # the first attempts really failed
    assert "Lock wait timeout" not in output
    assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)
