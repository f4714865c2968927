"""Kafka → Spark → a Delta Lake table exactly once: the table's own commit (``txnAppId`` / ``txnVersion``) is the
commit point. Each run is a child process (a Spark session of its own, started with the Delta conf the sink asks
for, as an Airflow task's is); the table is read back with delta-rs (``deltalake``), which shares nothing with Spark.
The SIGKILL chain around the table's commit is ``test_table_format_crash_chains.py``'s, shared with Iceberg.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from examples.page_views import produce_page_views
from examples.topics import read_records
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.page_views import (
    batch_rows,
    hour,
    hours_truth,
    produce_hours,
    release,
    run_child,
    start_held,
    wait_held,
)


def child(job: dict[str, Any], run_id: str, fault: str | None = None) -> Any:
    return run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})], fault=fault)


def table_rows(path: Path) -> list[dict[str, Any]]:
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if (path / "_delta_log").exists() else []


def test_appended_intervals_backfill_and_replay_once_under_a_name_in_a_metastore(bootstrap, mysql_kwargs, topic_name,
                                                                                  tmp_path):
    """Interval mode, appending: an hour, then an earlier hour backfilled (an app id of its own: not skipped as
    already seen below the later hour's batch id), then the later hour again (its batch is in the table: skipped,
    no new version). The table holds each event of both hours once, as produced; each version names its offsets.
    The table also has a name (``table=``) in a Hive metastore (Spark's embedded Derby one, on disk: the pyspark
    wheel ships Hive and Derby): created under it by the first run, found under it by the next ones (each a process
    of its own), never registered again."""
    create_topic(bootstrap, topic_name, 2)
    events = produce_hours(bootstrap, topic_name, [200, 300, 60])  # hour 2 closes hour 1 on every partition
    path, pipeline = tmp_path / "events", f"delta_append_{topic_name}"
    metastore = {"spark.sql.catalogImplementation": "hive", "spark.sql.warehouse.dir": str(tmp_path / "warehouse"),
                 "spark.hadoop.javax.jdo.option.ConnectionURL":
                     f"jdbc:derby:;databaseName={tmp_path / 'metastore_db'};create=true",
                 "spark.driver.extraJavaOptions": f"-Dderby.system.home={tmp_path}"}  # its derby.log
    job: dict[str, Any] = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
                           "options": {"mode": "interval", "spark_conf": metastore},
                           "sink": {"kind": "DeltaTableSink", "path": str(path), "table": "eo_lake.events"}}
    said: list[str] = []

    def run_hour(h: int, run_id: str) -> dict[str, Any]:
        done = child({**job, "interval": [t.isoformat() for t in hour(h)]}, run_id)
        assert done.returncode == 0, why(done)
        said.append(done.stdout + done.stderr)
        return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))

    run_hour(1, "backfill__h1")
    assert f"created the Delta table at {path} from the output's schema as eo_lake.events" in said[0]
    backfilled = run_hour(0, "backfill__h0")  # one pass: the writing job counted the records
    assert backfilled["rows_out"] == backfilled["records_in"] == len(hours_truth(events, 0))
    assert "count" not in backfilled["seconds"], "the records were counted by a job of their own"
    assert "registered the Delta table" not in said[1] and "created the Delta table" not in said[1], \
        "the metastore must keep the name from the first run's process"
    version = DeltaTable(str(path)).version()
    replay = run_hour(1, "scheduled__h1_again")
    assert replay["replayed"] and replay["rows_out"] == 0
    assert DeltaTable(str(path)).version() == version, "the replayed hour must not commit again"

    written = table_rows(path)
    assert Counter(r["event_id"] for r in written).most_common(1)[0][1] == 1, "an event was appended twice"
    by_id = {e["event_id"]: e for e in events}
    assert {r["event_id"] for r in written} == hours_truth(events, 0, 1)
    assert all((r["app_id"], r["user_id"]) == (by_id[r["event_id"]]["app_id"], by_id[r["event_id"]]["user_id"])
               for r in written)
    # Each batch's version carries its identity and offset ranges (DESCRIBE HISTORY's userMetadata).
    noted = {}
    for entry in DeltaTable(str(path)).history():
        if entry.get("userMetadata"):
            meta = json.loads(entry["userMetadata"])
            noted[meta["airflow_eo.batch"]] = meta["airflow_eo.ranges"]
    recorded = {b["batch_id"]: [[r["topic"], r["partition"], r["from_offset"], r["until_offset"]]
                                for r in b["ranges"]] for b in batch_rows(mysql_kwargs, pipeline)}
    assert noted == recorded


def test_two_pipelines_merge_into_one_table_at_once(bootstrap, mysql_kwargs, topic_name, tmp_path):
    """Two pipelines (a topic each) MERGE into one table with ``pv`` added on the same keys, both let go at once
    from just before their commit: both MERGEs read the table before either commits, so Delta refuses the later
    commit (ConcurrentAppendException); that pipeline must ask the table again and MERGE again. The table holds both
    topics' counts."""
    topics = {"a": topic_name, "b": f"{topic_name}_b"}
    path = tmp_path / "app_pv"
    sink = {"kind": "DeltaTableSink", "path": str(path), "key_columns": ["app_id"], "updates": {"pv": "add"}}
    for topic, count in zip(topics.values(), (300, 200), strict=True):
        create_topic(bootstrap, topic, 1)
        produce_page_views(bootstrap, count, topic=topic)
    held = {}
    for name, topic in topics.items():
        (tmp_path / name).mkdir()
        job = {"topic": topic, "pipeline_id": f"delta_two_{name}_{topic_name}", "sink": sink,
               "offset_store_conn_id": "eo_offset_store", "transform": "SELECT app_id, 1 AS pv FROM kafka_batch"}
        held[name] = start_held(job, f"manual__{uuid.uuid4().hex}", "before_table_commit", tmp_path / name,
                                wait=False)
    for name, run in held.items():
        wait_held(run, "before_table_commit", tmp_path / name)
    for name in held:  # both at once
        (tmp_path / name / "release-before_table_commit").touch()
    done = {name: release(run, "before_table_commit", tmp_path / name) for name, run in held.items()}
    for run in done.values():
        assert run.returncode == 0, why(run)
    # Released together, the two MERGEs have overlapped in every run here (10 of 10), so one commit was refused and
    # retried; a machine that starves one child for the seconds a MERGE takes runs them one after the other, which
    # must give the same table, so the conflict is logged, not required.
    said = [run.stdout + run.stderr for run in done.values()]
    print("commit conflict retried:", any("refused the commit of batch 0" in s and "retrying" in s for s in said))

    truth = Counter(json.loads(r.value)["app_id"] for t in topics.values() for r in read_records(bootstrap, t)[0])
    assert {r["app_id"]: r["pv"] for r in table_rows(path)} == truth
    assert sum(truth.values()) == 500


def test_a_bad_record_fails_its_batch_in_the_writing_job_and_the_table_commits_nothing(bootstrap, mysql_kwargs,
                                                                                       topic_name, tmp_path):
    """MERGE on ``event_id`` without a transform runs one pass (``core/write_strategy``: FAIL_IN_TASKS): the job that
    writes counts the records. A later batch holding a bad record fails in the task that reads it: Delta commits no
    version, the batch stays planned, and the error names the record."""
    create_topic(bootstrap, topic_name, 1)
    path, pipeline = tmp_path / "events", f"delta_bad_{topic_name}"
    job: dict[str, Any] = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
                           "sink": {"kind": "DeltaTableSink", "path": str(path), "key_columns": ["event_id"]}}
    events = produce_page_views(bootstrap, 200, topic=topic_name)
    done = child(job, f"manual__{uuid.uuid4().hex}")
    assert done.returncode == 0, why(done)
    summary = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (200, 200, 0)
    assert "count" not in summary["seconds"], "the records were counted by a job of their own"
    version = DeltaTable(str(path)).version()
    assert list(table_rows(path)[0]) == ["event_id", "app_id", "user_id", "ts"], "the events' columns, no other"

    produce_page_views(bootstrap, 50, topic=topic_name, raw_values=[b"{not json"])  # the bad record: offset 250
    failed = child(job, f"manual__{uuid.uuid4().hex}")
    assert failed.returncode != 0, why(failed)
    said = failed.stdout + failed.stderr
    assert f"1 bad record(s) in this batch; the first: {topic_name}[0] offset 250" in said, why(failed)
    assert DeltaTable(str(path)).version() == version, "a batch with a bad record must not commit"
    assert sorted(r["event_id"] for r in table_rows(path)) == sorted(e["event_id"] for e in events)
    assert [b["state"] for b in batch_rows(mysql_kwargs, pipeline)] == ["committed", "planned"]
