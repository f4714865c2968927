"""Exactly-once under SIGKILL around a table format's own commit, written once for Delta Lake and Apache Iceberg (as
``test_sink_crash_chains.py`` is for the SQL sinks): a MERGE with ``add`` updates killed before the table's commit,
after it (the store does not know yet), and after the store's commit point. Each run is a child process (a Spark
session of its own, started with the conf the sink asks for, as an Airflow task's is); the table is read back with
delta-rs or pyiceberg (:mod:`tests.support.table_formats`), which share nothing with Spark."""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from typing import Any

import pytest
from deltalake import DeltaTable

from airflow_eo.core.recovery import table_transaction
from airflow_eo.core.rewind import DOUBLE_COUNT_FLAG
from examples.page_views import produce_page_views
from examples.topics import read_records
from tests.support.children import why
from tests.support.cli import eo, eo_json
from tests.support.kafka import create_topic
from tests.support.page_views import assert_contiguous, batch_rows, committed_offsets, run_child
from tests.support.table_formats import TABLE_FORMATS, format_table


def child(job: dict[str, Any], run_id: str, fault: str | None = None) -> Any:
    return run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})], fault=fault)


@pytest.mark.parametrize("kind", TABLE_FORMATS)
def test_merge_with_add_survives_sigkill_around_the_table_commit(kind, bootstrap, mysql_kwargs, topic_name,
                                                                  tmp_path):
    """MERGE on app_id (``pv`` added, ``last_user`` the last event's in offset order) killed before the table's
    commit, after it (the store does not know yet: the next run, another run, must roll the store forward and not
    write the batch again), and after the store's commit point; then the same run, more events and a later run."""
    create_topic(bootstrap, topic_name, 1)  # one partition: "the last event in offset order" is one event
    table = format_table(kind, tmp_path, "app_pv", key_columns=["app_id"], updates={"pv": "add"})
    pipeline = f"{kind}_merge_{topic_name}"
    job: dict[str, Any] = {
        "topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
        "transform": "SELECT app_id, 1 AS pv, user_id AS last_user FROM kafka_batch", "sink": table.sink}
    produce_page_views(bootstrap, 1000, topic=topic_name)

    first = f"manual__{uuid.uuid4().hex}"
    crashed = child(job, first, "before_table_commit")
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    assert table.rows() == [], "nothing of the batch may be in the table before its commit"

    crashed = child(job, first, "after_table_commit")  # the same run again: resumes its batch, commits the table
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    [batch] = batch_rows(mysql_kwargs, pipeline)
    assert batch["state"] == "planned", "the store must not know of the table's commit yet"
    ranges = [[r["topic"], r["partition"], r["from_offset"], r["until_offset"]] for r in batch["ranges"]]
    assert table.batches(pipeline) == {batch["batch_id"]: ranges}, "the table's commit names the batch"
    if kind == "delta":  # and its transaction identity, which Delta's recovery asks
        txn = table_transaction(pipeline, batch["batch_id"], None)
        assert DeltaTable(str(table.location)).transaction_version(txn.app_id) == batch["batch_id"]
    assert sum(r["pv"] for r in table.rows()) == 1000, "the table committed the whole batch"
    status = eo_json("status", pipeline)  # asks the table, as recovery will
    assert [u["recover"] for u in status["unfinished"]] == ["roll forward"]
    assert table.status_note(batch["batch_id"]) in status["notes"]
    produce_page_views(bootstrap, 300, topic=topic_name)

    second = f"manual__{uuid.uuid4().hex}"  # another run meets the table's batch: rolls the store forward
    crashed = child(job, second, "after_commit_point")
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    assert "rolling forward" in crashed.stdout + crashed.stderr
    assert [b["state"] for b in batch_rows(mysql_kwargs, pipeline)] == ["committed", "committed"]

    retried = child(job, second)  # the committed run again: nothing to do
    assert retried.returncode == 0, why(retried)
    produce_page_views(bootstrap, 200, topic=topic_name)
    later = child(job, f"manual__{uuid.uuid4().hex}")
    assert later.returncode == 0, why(later)

    events = [json.loads(r.value) for r in read_records(bootstrap, topic_name)[0]]  # in offset order
    last_user = {e["app_id"]: e["user_id"] for e in events}
    truth = {app: (pv, last_user[app]) for app, pv in Counter(e["app_id"] for e in events).items()}
    assert {r["app_id"]: (r["pv"], r["last_user"]) for r in table.rows()} == truth
    assert sum(committed_offsets(mysql_kwargs, pipeline).values()) == len(events) == 1500
    batches = batch_rows(mysql_kwargs, pipeline)
    assert_contiguous(batches)
    assert sorted(table.batches(pipeline)) == [b["batch_id"] for b in batches], "one commit per batch"
    # "add" counts reprocessed offsets twice: a rewind needs the operator's word for it, and is refused without.
    refused = eo("rewind", pipeline, "--to-earliest", "--apply", "--reason", "again")
    assert refused.returncode != 0 and DOUBLE_COUNT_FLAG in refused.stderr, refused.stderr
    assert table.sink["kind"] in refused.stderr
    assert sum(committed_offsets(mysql_kwargs, pipeline).values()) == 1500
