"""Kafka → Spark → an Apache Iceberg table exactly once: the table's own commit (one snapshot per batch, its summary
naming the batch) is the commit point. Each run is a child process (a Spark session of its own, started with the
Iceberg conf the sink asks for, as an Airflow task's is); the table is read back with pyiceberg, which shares
nothing with Spark.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from pyiceberg.table import StaticTable

from examples.page_views import produce_page_views
from examples.topics import read_records
from tests.integration.page_views import (
    assert_contiguous,
    batch_rows,
    committed_offsets,
    hour,
    hours_truth,
    produce_hours,
    run_child,
)
from tests.support.children import why
from tests.support.cli import eo_json
from tests.support.kafka import create_topic


def child(job: dict[str, Any], run_id: str, fault: str | None = None) -> Any:
    return run_child(["-m", "tests.integration.operator_child", json.dumps({**job, "run_id": run_id})], fault=fault)


def table_rows(location: Path) -> list[dict[str, Any]]:
    if not (location / "metadata" / "version-hint.text").exists():
        return []
    return StaticTable.from_metadata(str(location)).scan().to_arrow().to_pylist()


def batch_snapshots(location: Path) -> dict[int, dict[str, str]]:
    """The summary of each snapshot that names an airflow_eo batch, by batch id (pyiceberg, not Spark)."""
    metadata = StaticTable.from_metadata(str(location)).metadata
    found = {}
    for snapshot in metadata.snapshots:
        summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        if "airflow-eo.batch" in summary:
            assert int(summary["airflow-eo.batch"]) not in found, "a batch committed two snapshots"
            found[int(summary["airflow-eo.batch"])] = summary
    return found


def test_merge_with_add_survives_sigkill_around_the_table_commit(bootstrap, mysql_kwargs, topic_name, tmp_path):
    """MERGE INTO on app_id (``pv`` added, ``last_user`` the last event's in offset order) killed before the table's
    commit, after it (the store does not know yet: the next run, another run, must roll the store forward and not
    write the batch again), and after the store's commit point; then the same run, more events and a later run."""
    create_topic(bootstrap, topic_name, 1)  # one partition: "the last event in offset order" is one event
    location, pipeline = tmp_path / "lake" / "db" / "app_pv", f"iceberg_merge_{topic_name}"
    job: dict[str, Any] = {
        "topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
        "transform": "SELECT app_id, 1 AS pv, user_id AS last_user FROM kafka_batch",
        "sink": {"kind": "IcebergTableSink", "table": "lake.db.app_pv", "warehouse": str(tmp_path / "lake"),
                 "key_columns": ["app_id"], "updates": {"pv": "add"}}}
    produce_page_views(bootstrap, 1000, topic=topic_name)

    first = f"manual__{uuid.uuid4().hex}"
    crashed = child(job, first, "before_table_commit")
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    assert table_rows(location) == [], "nothing of the batch may be in the table before its commit"

    crashed = child(job, first, "after_table_commit")  # the same run again: resumes its batch, commits the table
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    [batch] = batch_rows(mysql_kwargs, pipeline)
    assert batch["state"] == "planned", "the store must not know of the table's commit yet"
    [(batch_id, summary)] = batch_snapshots(location).items()
    assert batch_id == batch["batch_id"] and summary["airflow-eo.pipeline"] == pipeline
    assert json.loads(summary["airflow-eo.ranges"]) == [[r["topic"], r["partition"], r["from_offset"],
                                                          r["until_offset"]] for r in batch["ranges"]]
    assert sum(r["pv"] for r in table_rows(location)) == 1000, "the table committed the whole batch"
    status = eo_json("status", pipeline)  # asks the table, as recovery will
    assert [u["recover"] for u in status["unfinished"]] == ["roll forward"]
    current = StaticTable.from_metadata(str(location)).metadata.current_snapshot_id
    assert f"Iceberg table lake.db.app_pv: snapshot {current}; this pipeline's last batch in it: batch {batch_id} " \
           f"at snapshot {current}" in status["notes"]
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
    assert {r["app_id"]: (r["pv"], r["last_user"]) for r in table_rows(location)} == truth
    assert sum(committed_offsets(mysql_kwargs, pipeline).values()) == len(events) == 1500
    assert_contiguous(batch_rows(mysql_kwargs, pipeline))
    assert sorted(batch_snapshots(location)) == [b["batch_id"] for b in batch_rows(mysql_kwargs, pipeline)]


def test_appended_intervals_backfill_and_replay_once(bootstrap, mysql_kwargs, topic_name, tmp_path):
    """Interval mode, appending: an hour, then an earlier hour backfilled (an app id of its own: not taken for
    already committed below the later hour's batch id), then the later hour again (its batch is in the table:
    skipped, no new snapshot). The table holds each event of both hours once; each snapshot names its offsets."""
    create_topic(bootstrap, topic_name, 2)
    events = produce_hours(bootstrap, topic_name, [200, 300, 60])  # hour 2 closes hour 1 on every partition
    location, pipeline = tmp_path / "lake" / "db" / "events", f"iceberg_append_{topic_name}"
    job: dict[str, Any] = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
                           "options": {"mode": "interval"},
                           "sink": {"kind": "IcebergTableSink", "table": "lake.db.events",
                                    "warehouse": str(tmp_path / "lake")}}

    def run_hour(h: int, run_id: str) -> dict[str, Any]:
        done = child({**job, "interval": [t.isoformat() for t in hour(h)]}, run_id)
        assert done.returncode == 0, why(done)
        return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))

    assert run_hour(1, "backfill__h1")["rows_out"] == len(hours_truth(events, 1))
    assert run_hour(0, "backfill__h0")["rows_out"] == len(hours_truth(events, 0))
    snapshot = StaticTable.from_metadata(str(location)).metadata.current_snapshot_id
    replay = run_hour(1, "scheduled__h1_again")
    assert replay["replayed"] and replay["rows_out"] == 0
    assert StaticTable.from_metadata(str(location)).metadata.current_snapshot_id == snapshot, \
        "the replayed hour must not commit again"

    written = table_rows(location)
    assert Counter(r["event_id"] for r in written).most_common(1)[0][1] == 1, "an event was appended twice"
    by_id = {e["event_id"]: e for e in events}
    assert {r["event_id"] for r in written} == hours_truth(events, 0, 1)
    assert all((r["app_id"], r["user_id"]) == (by_id[r["event_id"]]["app_id"], by_id[r["event_id"]]["user_id"])
               for r in written)
    # Each batch's snapshot carries its identity, interval and offset ranges (the summary's airflow-eo.* keys).
    recorded = {b["batch_id"]: [[r["topic"], r["partition"], r["from_offset"], r["until_offset"]]
                                for r in b["ranges"]] for b in batch_rows(mysql_kwargs, pipeline)}
    noted = batch_snapshots(location)
    assert {b: json.loads(s["airflow-eo.ranges"]) for b, s in noted.items()} == recorded
    assert sorted(s["airflow-eo.interval"] for s in noted.values()) == sorted(
        f"{hour(h)[0].isoformat()}/{hour(h)[1].isoformat()}" for h in (0, 1))
