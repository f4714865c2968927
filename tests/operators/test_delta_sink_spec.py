"""DeltaTableSink's options (checked at parse time) and the Spark conf it asks for (Delta's jars, pinned)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_eo.core.config import BadRecordPolicy, Mode, ParseConfig, check_pipeline
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.spark_conf import with_sink_spark_conf
from airflow_eo.sinks import DeltaTableSink, spec_from_record
from airflow_eo.spark import jars, session
from airflow_eo.spark.jars import JAR_SHA256


def test_options_are_checked_when_the_dag_is_parsed():
    merge = DeltaTableSink(path="/data/app_pv", key_columns=["app_id"], updates={"pv": "add"})
    assert merge.accumulating and merge.replay_safe  # a replayed interval is skipped by the table itself
    assert not DeltaTableSink(path="/d", key_columns=["k"], updates={"v": "replace"}).accumulating
    assert DeltaTableSink(path="/d").accumulating  # appends: a rewind counts them twice
    assert spec_from_record(merge.record()) == merge
    with pytest.raises(ConfigurationError, match="updates need key_columns"):
        DeltaTableSink(path="/d", updates={"pv": "add"})
    with pytest.raises(ConfigurationError, match="invalid key column"):
        DeltaTableSink(path="/d", key_columns=["app id; DROP"])
    with pytest.raises(ConfigurationError, match="path must name"):
        DeltaTableSink(path=" ")
    named = DeltaTableSink(path="/d", table="lake.db.events")
    assert spec_from_record(named.record()) == named and named.target == "/d"
    with pytest.raises(ConfigurationError, match="table= needs path= too .* outside any Spark session"):
        DeltaTableSink(table="db.events")
    with pytest.raises(ConfigurationError, match="'db.table' or 'catalog.db.table'"):
        DeltaTableSink(path="/d", table="events")
    with pytest.raises(ConfigurationError, match="invalid table name part"):
        DeltaTableSink(path="/d", table="db.events; DROP")
    with pytest.raises(ConfigurationError, match="on_tombstone='delete' is not supported"):
        DeltaTableSink(path="/d", key_columns=["k"], on_tombstone="delete")
    check_pipeline(merge, Mode.INTERVAL, ParseConfig(schema="app_id STRING"), None)
    with pytest.raises(ConfigurationError, match="on_bad_record='fail' only"):
        check_pipeline(merge, Mode.CONTINUOUS, ParseConfig(schema="a STRING",
                                                           on_bad_record=BadRecordPolicy.DEAD_LETTER), None)


def test_the_asset_is_the_tables_location():
    assert DeltaTableSink(path="/data/app.pv").asset(None).uri == "file:///data/app.pv"  # type: ignore[arg-type]
    assert DeltaTableSink(path="s3a://lake/app_pv").asset(None).uri == "s3a://lake/app_pv"  # type: ignore[arg-type]


def test_the_sinks_spark_conf_joins_the_users():
    sink = DeltaTableSink(path="/d")
    conf = with_sink_spark_conf(sink, {"spark.sql.extensions": "my.Ext", "spark.sql.catalog.spark_catalog": "x.Mine",
                                       "spark.driver.memory": "2g"})
    assert conf["spark.sql.extensions"] == "my.Ext,io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"] == "x.Mine"  # the user's own choice wins
    assert conf["spark.jars.packages"] == "io.delta:delta-spark_2.13:4.0.0"


def test_deltas_jars_are_refused_unless_they_match_their_pins(tmp_path, monkeypatch):
    monkeypatch.setenv("EO_CACHE_DIR", str(tmp_path))
    name = "delta-spark_2.13-4.0.0"
    folder = tmp_path / name / "jars"
    folder.mkdir(parents=True)
    for jar in JAR_SHA256[name]:
        (folder / jar).write_bytes(b"not the jar")
    (tmp_path / name / ".complete").touch()
    with pytest.raises(ConfigurationError, match="delta-spark_2.13-4.0.0.jar has SHA-256"):
        jars.pinned_package_jars("io.delta:delta-spark_2.13:4.0.0")
    assert jars.pinned_package_jars("org.example:unpinned:1") is None  # left to Spark's Ivy


def test_deltas_jars_resolved_here_join_spark_jars(monkeypatch):
    monkeypatch.delenv("EO_CACHE_DIR", raising=False)
    if not (jars.connector_cache_dir() / "delta-spark_2.13-4.0.0" / ".complete").exists():
        pytest.skip("Delta's jars are not resolved here yet (a Delta sink's first run resolves them)")
    conf = session.session_conf({"spark.jars.packages": "io.delta:delta-spark_2.13:4.0.0,org.example:other:1"})
    delta = {Path(j).name for j in conf["spark.jars"].split(",") if Path(j).parent.parent.name.startswith("delta")}
    # Not Delta's scala-library and antlr4-runtime: pyspark ships them, at other versions.
    assert delta == {"delta-spark_2.13-4.0.0.jar", "delta-storage-4.0.0.jar"}
    assert conf["spark.jars.packages"] == "org.example:other:1"


def test_a_txn_version_above_the_batch_written_is_refused_not_trusted_to_skip(tmp_path):
    """Any writer of the Delta table can commit a txn of the pipeline's app id (delta-rs here, as another job
    would): one above the batch being written (the store's newest planned) would have the sink skip every batch up
    to it, offsets advancing and nothing written; it is refused loudly, at the write and at recovery."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from airflow_eo.core.batch import BatchRecord
    from airflow_eo.core.batch_states import BatchState
    from airflow_eo.core.errors import TableMarkerError
    from airflow_eo.core.ranges import OffsetRange
    from airflow_eo.core.recovery import table_transaction
    from airflow_eo.delta.sink import DeltaTableAdapter

    path = str(tmp_path / "t")
    adapter = DeltaTableAdapter("p", name="DeltaTableSink", path=path)
    write_deltalake(path, pa.table({"v": [1]}), commit_properties=CommitProperties(
        app_transactions=[Transaction("airflow_eo.p", 3)]))
    assert adapter._has(table_transaction("p", 3, None)) and not adapter._has(table_transaction("p", 4, None))
    write_deltalake(path, pa.table({"v": [2]}), mode="append", commit_properties=CommitProperties(
        app_transactions=[Transaction("airflow_eo.p", 10**9)]))
    with pytest.raises(TableMarkerError, match=f"the Delta table at {path} claims batch 1000000000 of airflow_eo.p"):
        adapter._has(table_transaction("p", 4, None))
    unfinished = BatchRecord("p", 4, "run4", 1, BatchState.PLANNED, [OffsetRange("t", 0, 0, 5)])
    with pytest.raises(TableMarkerError, match="above the newest batch the offset store planned \\(4\\)"):
        adapter.committed_batches([unfinished])


def test_a_path_with_a_password_in_it_is_refused_without_echoing_it():
    """``s3a://KEY:SECRET@bucket/...`` would be kept in lineage namespaces, Asset URIs and logs; ABFS's
    ``container@account`` names a container, no password."""
    from airflow_eo.sinks import IcebergTableSink

    with pytest.raises(ConfigurationError, match="holds a password in its authority") as refused:
        DeltaTableSink(path="s3a://AKIAEXAMPLE:s3cr3t@bucket/events")
    assert "s3cr3t" not in str(refused.value)
    with pytest.raises(ConfigurationError, match="warehouse holds a password"):
        IcebergTableSink(table="lake.db.t", warehouse="s3a://AKIAEXAMPLE:s3cr3t@bucket/lake")
    assert DeltaTableSink(path="abfss://events@account.dfs.core.windows.net/t").lineage(None).namespace == \
        "abfss://events@account.dfs.core.windows.net"  # type: ignore[arg-type]
    assert DeltaTableSink(path="s3a://bucket/events").path == "s3a://bucket/events"
