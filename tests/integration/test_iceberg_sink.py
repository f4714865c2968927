"""Kafka → Spark → an Apache Iceberg table exactly once: the table's own commit (one snapshot per batch, its summary
naming the batch) is the commit point. Each run is a child process (a Spark session of its own, started with the
Iceberg conf the sink asks for, as an Airflow task's is); the table is read back with pyiceberg, which shares
nothing with Spark. The SIGKILL chain around the table's commit is ``test_table_format_crash_chains.py``'s, shared
with Delta.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import StaticTable

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
)
from tests.support.table_formats import batch_snapshots


def child(job: dict[str, Any], run_id: str, fault: str | None = None) -> Any:
    return run_child(["-m", "tests.support.operator_child", json.dumps({**job, "run_id": run_id})], fault=fault)


def table_rows(location: Path) -> list[dict[str, Any]]:
    if not (location / "metadata" / "version-hint.text").exists():
        return []
    return StaticTable.from_metadata(str(location)).scan().to_arrow().to_pylist()


def zombie_then_newer(job: dict[str, Any], folder: Path) -> str:
    """An attempt held just before its table commit (a zombie: its Airflow task was given up on) while a newer attempt
    of the same run checks the table, writes and commits the batch; then the zombie is let go. Its output, after
    checking that it failed (it must not commit the batch)."""
    run_id = f"manual__{uuid.uuid4().hex}"
    folder.mkdir()
    zombie = start_held(job, run_id, "before_table_commit", folder)
    try:
        newer = child(job, run_id)  # the retry of the same task: resumes the batch, commits table and store
        assert newer.returncode == 0, why(newer)
    finally:
        late = release(zombie, "before_table_commit", folder)
    said = late.stdout + late.stderr
    assert late.returncode != 0, "the zombie must not commit its batch: " + said[-3000:]
    return said


def jdbc_catalog() -> SqlCatalog:
    """The stack's PostgreSQL as pyiceberg's SQL catalog ``lake``: the rows Iceberg's Java JDBC catalog wrote."""
    url = urlsplit(os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    return SqlCatalog("lake", uri=urlunsplit(url._replace(scheme="postgresql+psycopg")))


def test_appended_intervals_backfill_and_replay_once_in_a_jdbc_catalog(bootstrap, mysql_kwargs, topic_name,
                                                                        tmp_path):
    """Interval mode, appending, into a table of Iceberg's JDBC catalog on PostgreSQL (``catalog_conn_id``: Spark's
    catalog and pyiceberg's read the same rows): an hour killed after the table's commit, then that run again (it
    finds its batch in the table: not written again, the store commits it), then an earlier hour backfilled (an app
    id of its own: not taken for already committed below the later hour's batch id), then the later hour again (its
    batch is in the table: skipped, no new snapshot). The table holds each event of both hours once; each snapshot
    names its offsets."""
    create_topic(bootstrap, topic_name, 2)
    events = produce_hours(bootstrap, topic_name, [200, 300, 60])  # hour 2 closes hour 1 on every partition
    identifier, pipeline = ("ns_" + topic_name, "events"), f"iceberg_append_{topic_name}"
    job: dict[str, Any] = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
                           "options": {"mode": "interval"},
                           "sink": {"kind": "IcebergTableSink", "table": f"lake.{'.'.join(identifier)}",
                                    "catalog_conn_id": "postgres_default", "warehouse": str(tmp_path / "lake")}}

    def run_hour(h: int, run_id: str, fault: str | None = None) -> Any:
        return child({**job, "interval": [t.isoformat() for t in hour(h)]}, run_id, fault)

    def summary(done: Any) -> dict[str, Any]:
        assert done.returncode == 0, why(done)
        return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))

    crashed = run_hour(1, "backfill__h1", "after_table_commit")
    assert crashed.returncode == -signal.SIGKILL, why(crashed)
    table = jdbc_catalog().load_table(identifier)
    assert {r["event_id"] for r in table.scan().to_arrow().to_pylist()} == hours_truth(events, 1)
    rolled = run_hour(1, "backfill__h1")
    assert summary(rolled)["rows_out"] == 0 and "already has batch 0" in rolled.stdout + rolled.stderr
    backfilled = summary(run_hour(0, "backfill__h0"))  # one pass: the writing job counted the records
    assert backfilled["rows_out"] == backfilled["records_in"] == len(hours_truth(events, 0))
    assert "count" not in backfilled["seconds"], "the records were counted by a job of their own"
    snapshot = jdbc_catalog().load_table(identifier).metadata.current_snapshot_id
    replay = summary(run_hour(1, "scheduled__h1_again"))
    assert replay["replayed"] and replay["rows_out"] == 0
    table = jdbc_catalog().load_table(identifier)
    assert table.metadata.current_snapshot_id == snapshot, "the replayed hour must not commit again"
    assert table.metadata.location == str(tmp_path.joinpath("lake", *identifier)), "the sink's warehouse"

    written = table.scan().to_arrow().to_pylist()
    assert Counter(r["event_id"] for r in written).most_common(1)[0][1] == 1, "an event was appended twice"
    by_id = {e["event_id"]: e for e in events}
    assert {r["event_id"] for r in written} == hours_truth(events, 0, 1)
    assert all((r["app_id"], r["user_id"]) == (by_id[r["event_id"]]["app_id"], by_id[r["event_id"]]["user_id"])
               for r in written)
    # Each batch's snapshot carries its identity, interval and offset ranges (the summary's airflow-eo.* keys).
    recorded = {b["batch_id"]: [[r["topic"], r["partition"], r["from_offset"], r["until_offset"]]
                                for r in b["ranges"]] for b in batch_rows(mysql_kwargs, pipeline)}
    noted = batch_snapshots(table.metadata)
    assert {b: json.loads(s["airflow-eo.ranges"]) for b, s in noted.items()} == recorded
    assert sorted(s["airflow-eo.interval"] for s in noted.values()) == sorted(
        f"{hour(h)[0].isoformat()}/{hour(h)[1].isoformat()}" for h in (0, 1))


def test_a_zombie_attempt_cannot_append_its_batch_again(bootstrap, mysql_kwargs, topic_name, tmp_path):
    """An attempt held just before its table commit (a zombie: its Airflow task was given up on) while a newer
    attempt of the same run checks the table, writes and commits the batch; then the zombie goes on and tries to
    commit the batch it wrote too. The table must hold each event once."""
    create_topic(bootstrap, topic_name, 1)
    location, pipeline = tmp_path / "lake" / "db" / "events", f"iceberg_zombie_{topic_name}"
    job: dict[str, Any] = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
                           "sink": {"kind": "IcebergTableSink", "table": "lake.db.events",
                                    "warehouse": str(tmp_path / "lake")}}
    produce_page_views(bootstrap, 100, topic=topic_name)
    said = zombie_then_newer(job, tmp_path / "fp")
    # Its publish was refused inside Iceberg's commit (the batch's wap.id is published), then the table was asked.
    assert "DuplicateWAPCommitException" in said and "already has batch" in said, said[-3000:]

    events = [json.loads(r.value) for r in read_records(bootstrap, topic_name)[0]]
    written = table_rows(location)
    assert Counter(r["event_id"] for r in written).most_common(1)[0][1] == 1, "an event was appended twice"
    assert sorted(r["event_id"] for r in written) == sorted(e["event_id"] for e in events)
    assert list(written[0]) == ["event_id", "app_id", "user_id", "ts"], "the events' columns, no other"
    [batch] = batch_rows(mysql_kwargs, pipeline)
    assert batch["state"] == "committed" and list(batch_snapshots(location)) == [batch["batch_id"]]

    # A later batch holding a bad record fails in the task that reads it (one pass: core/write_strategy's
    # FAIL_IN_TASKS): nothing staged, nothing published.
    snapshots = len(StaticTable.from_metadata(str(location)).metadata.snapshots)
    produce_page_views(bootstrap, 30, topic=topic_name, raw_values=[b"{not json"])  # the bad record: offset 130
    failed = child(job, f"manual__{uuid.uuid4().hex}")
    assert failed.returncode != 0, why(failed)
    assert f"1 bad record(s) in this batch; the first: {topic_name}[0] offset 130" in failed.stdout + failed.stderr
    assert len(StaticTable.from_metadata(str(location)).metadata.snapshots) == snapshots
    assert [b["state"] for b in batch_rows(mysql_kwargs, pipeline)] == ["committed", "planned"]



def test_a_zombie_attempt_cannot_publish_its_merge_again(bootstrap, mysql_kwargs, topic_name, tmp_path):
    """The MERGE's zombie: an attempt held after staging its MERGE snapshot while a newer attempt of the same run
    merges and publishes the batch; let go, the zombie's fast-forward is refused (the table moved past the snapshot
    it merged into) and, asking the table, it finds its batch there. ``pv`` is added: a second publish would count
    every event twice."""
    create_topic(bootstrap, topic_name, 1)
    location, pipeline = tmp_path / "lake" / "db" / "app_pv", f"iceberg_merge_zombie_{topic_name}"
    job: dict[str, Any] = {"topic": topic_name, "pipeline_id": pipeline, "offset_store_conn_id": "eo_offset_store",
                           "transform": "SELECT app_id, 1 AS pv FROM kafka_batch",
                           "sink": {"kind": "IcebergTableSink", "table": "lake.db.app_pv",
                                    "warehouse": str(tmp_path / "lake"), "key_columns": ["app_id"],
                                    "updates": {"pv": "add"}}}
    produce_page_views(bootstrap, 300, topic=topic_name)
    said = zombie_then_newer(job, tmp_path / "fp")
    assert "not a fast-forward" in said and "already has batch" in said, said[-3000:]

    truth = Counter(json.loads(r.value)["app_id"] for r in read_records(bootstrap, topic_name)[0])
    assert {r["app_id"]: r["pv"] for r in table_rows(location)} == truth and sum(truth.values()) == 300
    [batch] = batch_rows(mysql_kwargs, pipeline)
    assert batch["state"] == "committed" and list(batch_snapshots(location)) == [batch["batch_id"]]

def test_two_pipelines_merge_into_one_table_at_once(bootstrap, mysql_kwargs, topic_name, tmp_path):
    """Two pipelines (a topic each) MERGE into one table with ``pv`` added on the same keys. Pipeline a is held
    after staging its MERGE while pipeline b commits one: a's staged MERGE read the table before b's commit, so it
    may not be published; a must ask the table again, MERGE again and commit. The table holds both topics' counts."""
    topics = {"a": topic_name, "b": f"{topic_name}_b"}
    sink = {"kind": "IcebergTableSink", "table": "lake.db.app_pv", "warehouse": str(tmp_path / "lake"),
            "key_columns": ["app_id"], "updates": {"pv": "add"}}
    jobs: dict[str, dict[str, Any]] = {
        name: {"topic": topic, "pipeline_id": f"iceberg_two_{name}_{topic_name}", "sink": sink,
               "offset_store_conn_id": "eo_offset_store", "transform": "SELECT app_id, 1 AS pv FROM kafka_batch"}
        for name, topic in topics.items()}
    for topic, count in zip(topics.values(), (300, 200), strict=True):
        create_topic(bootstrap, topic, 1)
        produce_page_views(bootstrap, count, topic=topic)
    folder = tmp_path / "fp"
    folder.mkdir()
    held = start_held(jobs["a"], f"manual__{uuid.uuid4().hex}", "before_table_commit", folder)
    try:
        other = child(jobs["b"], f"manual__{uuid.uuid4().hex}")
        assert other.returncode == 0, why(other)
    finally:
        late = release(held, "before_table_commit", folder)
    said = late.stdout + late.stderr
    assert late.returncode == 0, why(late)
    assert "refused the commit of batch 0" in said and "retrying" in said, said[-3000:]

    truth = Counter(json.loads(r.value)["app_id"] for t in topics.values() for r in read_records(bootstrap, t)[0])
    location = tmp_path / "lake" / "db" / "app_pv"
    assert {r["app_id"]: r["pv"] for r in table_rows(location)} == truth
    assert sum(truth.values()) == 500
    for job in jobs.values():  # each pipeline's batch is one snapshot of the table's history
        assert list(batch_snapshots(location, job["pipeline_id"])) == [
            b["batch_id"] for b in batch_rows(mysql_kwargs, job["pipeline_id"])] == [0]


def test_a_rest_catalogs_credential_is_redacted_in_the_sql_tab_and_event_log():
    """A REST catalog's ``credential`` (``id:secret``) and the file-system keys of a catalog's extra
    (``s3.secret-access-key``, ``adls.account-key``) are set on the running session: every later query's SQL
    execution carries the session's modified conf, which the SQL tab shows and the event log keeps
    (``SparkListenerSQLExecutionStart.modifiedConfigs``). Spark's default redaction matches none of these keys."""
    from airflow_eo.core.connections import ConnectionInfo
    from airflow_eo.iceberg.catalog import catalog_properties
    from airflow_eo.iceberg.sink import IcebergTableAdapter
    from airflow_eo.spark.session import get_session

    secret = f"s3cr3t{uuid.uuid4().hex}"
    name = f"rest{uuid.uuid4().hex[:8]}"  # a catalog no query uses: Spark loads a catalog on first use only
    info = ConnectionInfo("lake_rest", "iceberg", "http://127.0.0.1:1/catalog", login="client", password=secret,
                          extra={"s3.secret-access-key": f"k1{secret}", "adls.account-key.acct": f"k2{secret}",
                                 "s3.access-key-id": f"k3{secret}"})
    adapter = IcebergTableAdapter("p", name="IcebergTableSink", table=f"{name}.db.t", location="",
                                  catalog=catalog_properties(info))
    spark = get_session()
    adapter._configure_catalog(spark)
    assert spark.conf.get(f"spark.sql.catalog.{name}.credential") == f"client:{secret}"  # set, for Iceberg
    spark.range(3).selectExpr("sum(id)").collect()  # a SQL execution after the properties were set
    store = spark._jsparkSession.sharedState().statusStore()  # what the SQL tab renders (and the event log has)
    executions = store.executionsList()
    last = executions.apply(executions.size() - 1).modifiedConfigs()  # a Scala Map
    modified: dict[str, str] = {}
    keys = last.keySet().iterator()
    while keys.hasNext():
        key = keys.next()
        modified[str(key)] = str(last.apply(key))
    assert f"spark.sql.catalog.{name}.credential" in modified  # the SQL tab lists it ...
    assert not [k for k, v in modified.items() if secret in v], "a catalog secret is shown in the SQL tab"


def test_icebergs_runtime_resolved_by_the_runs_above_joins_spark_jars(monkeypatch):
    """The Iceberg runs above resolved Iceberg's runtime into the cache (checked against its pin): a session's conf
    names its jar in ``spark.jars`` and leaves Spark no package to resolve. (In ``tests/operators`` this was skipped
    whenever it ran before any Iceberg run.)"""
    from airflow_eo.spark import jars, session

    runtime = "iceberg-spark-runtime-4.0_2.13-1.10.0"
    monkeypatch.delenv("EO_CACHE_DIR", raising=False)
    assert (jars.connector_cache_dir() / runtime / ".complete").exists(), "the Iceberg runs above resolve it"
    conf = session.session_conf({"spark.jars.packages": "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"})
    assert {Path(j).name for j in conf["spark.jars"].split(",") if "iceberg" in j} == {f"{runtime}.jar"}
    assert "spark.jars.packages" not in conf
