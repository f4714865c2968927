"""IcebergTableSink's options (checked at parse time), its Asset, and the Spark conf it asks for (Iceberg's runtime,
pinned; a Hadoop catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_eo.core.config import Mode, ParseConfig, check_pipeline
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.sinks import with_sink_spark_conf
from airflow_eo.sinks import IcebergTableSink, spec_from_record
from airflow_eo.spark import session
from airflow_eo.spark.session import JAR_SHA256

RUNTIME = "iceberg-spark-runtime-4.0_2.13-1.10.0"


def test_options_are_checked_when_the_dag_is_parsed():
    merge = IcebergTableSink(table="lake.db.app_pv", warehouse="/data/lake", key_columns=["app_id"],
                             updates={"pv": "add"})
    assert merge.accumulating and merge.replay_safe  # a replayed interval finds its snapshot: nothing written
    assert not IcebergTableSink(table="l.d.t", warehouse="/w", key_columns=["k"], updates={"v": "replace"}).accumulating
    assert spec_from_record(merge.record()) == merge
    assert merge.location == "/data/lake/db/app_pv"  # the Hadoop catalog's layout
    assert IcebergTableSink(table="l.a.b.t", warehouse="s3a://x/").location == "s3a://x/a/b/t"
    with pytest.raises(ConfigurationError, match="'catalog.namespace.table'"):
        IcebergTableSink(table="db.t", warehouse="/w")
    with pytest.raises(ConfigurationError, match="invalid table name part"):
        IcebergTableSink(table="lake.db.t; DROP", warehouse="/w")
    with pytest.raises(ConfigurationError, match="warehouse must name"):
        IcebergTableSink(table="l.d.t", warehouse=" ")
    with pytest.raises(ConfigurationError, match="updates need key_columns"):
        IcebergTableSink(table="l.d.t", warehouse="/w", updates={"pv": "add"})
    with pytest.raises(ConfigurationError, match="a key column cannot have an update mode"):
        IcebergTableSink(table="l.d.t", warehouse="/w", key_columns=["k"], updates={"k": "add"})
    with pytest.raises(ConfigurationError, match="on_tombstone='delete' is not supported"):
        IcebergTableSink(table="l.d.t", warehouse="/w", key_columns=["k"], on_tombstone="delete")
    check_pipeline(merge, Mode.INTERVAL, ParseConfig(schema="app_id STRING"), None)


def test_the_asset_names_the_catalog_and_table():
    sink = IcebergTableSink(table="lake.db.app_pv", warehouse="/w")
    assert sink.asset(None).uri == "iceberg://lake/db/app_pv"  # type: ignore[arg-type]


def test_the_sinks_spark_conf_configures_a_hadoop_catalog_under_the_users():
    sink = IcebergTableSink(table="lake.db.t", warehouse="/data/lake")
    conf = with_sink_spark_conf(sink, {"spark.sql.extensions": "my.Ext", "spark.sql.catalog.lake.io-impl": "x.IO",
                                       "spark.sql.catalog.lake.warehouse": "/mine"})
    assert conf["spark.sql.extensions"] == "my.Ext,org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.type"] == "hadoop"
    assert conf["spark.sql.catalog.lake.warehouse"] == "/mine"  # the user's own choice wins
    assert conf["spark.sql.catalog.lake.io-impl"] == "x.IO"
    assert conf["spark.jars.packages"] == "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"


def test_icebergs_runtime_is_refused_unless_it_matches_its_pin(tmp_path, monkeypatch):
    monkeypatch.setenv("EO_CACHE_DIR", str(tmp_path))
    folder = tmp_path / RUNTIME / "jars"
    folder.mkdir(parents=True)
    for jar in JAR_SHA256[RUNTIME]:
        (folder / jar).write_bytes(b"not the jar")
    (tmp_path / RUNTIME / ".complete").touch()
    with pytest.raises(ConfigurationError, match=f"{RUNTIME}.jar has SHA-256"):
        session.pinned_package_jars("org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0")


def test_icebergs_runtime_resolved_here_joins_spark_jars(monkeypatch):
    monkeypatch.delenv("EO_CACHE_DIR", raising=False)
    if not (session.connector_cache_dir() / RUNTIME / ".complete").exists():
        pytest.skip("Iceberg's runtime is not resolved here yet (an Iceberg sink's first run resolves it)")
    conf = session.session_conf({"spark.jars.packages": "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"})
    assert {Path(j).name for j in conf["spark.jars"].split(",") if "iceberg" in j} == {f"{RUNTIME}.jar"}
    assert "spark.jars.packages" not in conf
