"""IcebergTableSink's options (checked at parse time), its Asset, and the Spark conf it asks for (Iceberg's runtime,
pinned; a Hadoop catalog)."""

from __future__ import annotations

import pytest

from airflow_eo.core.config import Mode, ParseConfig, check_pipeline
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.spark_conf import with_sink_spark_conf
from airflow_eo.iceberg.catalog import catalog_properties
from airflow_eo.iceberg.specs import ICEBERG_PACKAGE, POSTGRES_JDBC_PACKAGE
from airflow_eo.sinks import IcebergTableSink, spec_from_record
from airflow_eo.spark import jars
from airflow_eo.spark.jars import JAR_SHA256

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
    with pytest.raises(ConfigurationError, match="give warehouse= .* or catalog_conn_id=.* spark_conf is not enough"):
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


def test_a_catalog_connection_is_the_sinks_connection_and_its_properties_never_reach_the_launch_conf():
    sink = IcebergTableSink(table="lake.db.t", catalog_conn_id="lake_catalog")
    assert sink.conn_id == "lake_catalog" and sink.location == ""
    assert spec_from_record(sink.record()) == sink
    assert spec_from_record(sink.record(), conn_id="other").catalog_conn_id == "other"  # airflow eo --sink-conn-id
    conf = with_sink_spark_conf(sink, {"spark.sql.catalog.lake.io-impl": "x.IO"})
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.jars.packages"].split(",") == [ICEBERG_PACKAGE, POSTGRES_JDBC_PACKAGE]
    assert not {"spark.sql.catalog.lake.type", "spark.sql.catalog.lake.warehouse"} & set(conf)  # the adapter's
    assert spec_from_record(IcebergTableSink(table="lake.db.t", warehouse="/w").record()).conn_id == ""


def test_a_merge_is_refused_over_spark_connect_and_an_append_is_not():
    assert IcebergTableSink(table="l.d.t", warehouse="/w").spark_connect_refusal() is None
    refusal = IcebergTableSink(table="l.d.t", warehouse="/w", key_columns=["k"]).spark_connect_refusal()
    assert refusal and "MERGE (key_columns) cannot run over Spark Connect" in refusal


def test_a_postgres_connection_is_a_jdbc_catalog_in_its_database_for_spark_and_pyiceberg():
    info = ConnectionInfo("lake_catalog", "postgres", "127.0.0.1", 5433, "eo", "p@ss:/word", "lakedb",
                          {"io-impl": "x.IO"})
    catalog = catalog_properties(info, "/data/lake")
    assert dict(catalog.spark) == {"type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1:5433/lakedb",
                                   "jdbc.user": "eo", "jdbc.password": "p@ss:/word", "warehouse": "/data/lake",
                                   "io-impl": "x.IO"}
    assert catalog.reader["type"] == "sql"
    assert catalog.reader["uri"] == "postgresql+psycopg://eo:p%40ss%3A%2Fword@127.0.0.1:5433/lakedb"
    assert "p@ss" not in repr(catalog) and "p%40ss" not in repr(catalog)
    with pytest.raises(ConfigurationError, match="needs a warehouse"):
        catalog_properties(info)
    rest = catalog_properties(ConnectionInfo("c", "iceberg", "https://cat.example/api", None, "id", "secret"))
    assert dict(rest.spark) == {"type": "rest", "uri": "https://cat.example/api", "credential": "id:secret"}
    assert catalog_properties(ConnectionInfo("c", "generic", extra={"type": "glue"})).reader == {"type": "glue"}
    with pytest.raises(ConfigurationError, match="does not name an Iceberg catalog"):
        catalog_properties(ConnectionInfo("c", "generic"))


def test_icebergs_runtime_is_refused_unless_it_matches_its_pin(tmp_path, monkeypatch):
    monkeypatch.setenv("EO_CACHE_DIR", str(tmp_path))
    folder = tmp_path / RUNTIME / "jars"
    folder.mkdir(parents=True)
    for jar in JAR_SHA256[RUNTIME]:
        (folder / jar).write_bytes(b"not the jar")
    (tmp_path / RUNTIME / ".complete").touch()
    with pytest.raises(ConfigurationError, match=f"{RUNTIME}.jar has SHA-256"):
        jars.pinned_package_jars("org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0")


def test_a_cherry_picked_snapshot_names_its_batch_by_its_staged_source_or_its_wap_id(tmp_path):
    """An append published by cherry-pick onto a table another writer changed is a new snapshot without our summary
    properties: recovery reads them from its staged source, or (the source expired) from its published wap id; a
    staged snapshot never published is not the table's."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.snapshots import Operation, Snapshot, Summary
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    from airflow_eo.core.recovery import table_transaction
    from airflow_eo.iceberg.sink import IcebergTableAdapter

    ours = {"airflow-eo.pipeline": "p", "airflow-eo.batch": "7", "airflow-eo.app-id": "airflow_eo.p",
            "wap.id": "airflow_eo.p@7"}

    def snapshot(snapshot_id: int, parent: int | None, **summary: str) -> Snapshot:
        return Snapshot(snapshot_id=snapshot_id, parent_snapshot_id=parent, sequence_number=snapshot_id,
                        timestamp_ms=snapshot_id, manifest_list=f"{tmp_path}/m{snapshot_id}.avro",
                        summary=Summary(Operation.APPEND, **summary), schema_id=0)

    other = snapshot(1, None)  # another writer's, committed while ours was staged
    staged, zombie = snapshot(2, None, **ours), snapshot(3, 1, **{**ours, "airflow-eo.batch": "8"})
    published = snapshot(4, 1, **{"source-snapshot-id": "2", "published-wap-id": "airflow_eo.p@7"})
    empty = new_table_metadata(Schema(), UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, str(tmp_path), {})
    metadata = empty.model_copy(update={"snapshots": [other, staged, zombie, published], "current_snapshot_id": 4})
    adapter = IcebergTableAdapter("p", name="IcebergTableSink", table="l.d.t", location=str(tmp_path))
    assert adapter.batch_snapshots(metadata) == [(4, ours)]

    expired = metadata.model_copy(update={"snapshots": [other, zombie, published]})
    assert adapter.batch_snapshots(expired) == [(4, {"airflow-eo.app-id": "airflow_eo.p", "airflow-eo.batch": "7"})]

    # A zombie's MERGE of batch 7 staged on the table after batch 7 was published: its parent's history holds the
    # batch, so it is not published (Iceberg would fast-forward it without a wap.id check); one staged before is.
    adapter.metadata = lambda: metadata  # type: ignore[method-assign]
    late, early = snapshot(5, 4, **ours), snapshot(6, 1, **ours)
    assert adapter._has(table_transaction("p", 7, None), late)
    assert not adapter._has(table_transaction("p", 7, None), early)
    assert not adapter._has(table_transaction("p", 8, None))  # batch 8 (the unpublished zombie's) is not in it


def test_markers_another_table_writer_set_are_ignored_or_refused_never_trusted_to_skip(tmp_path):
    """Any writer of the table can set snapshot properties: a non-integer ``airflow-eo.batch`` (or
    ``source-snapshot-id``) is not ours and is ignored (before, every attempt raised on ``int()``); a forged marker
    above the batch being written (the store's newest planned) is refused loudly instead of skipping the batch."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.snapshots import Operation, Snapshot, Summary
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    from airflow_eo.core.errors import TableMarkerError
    from airflow_eo.core.recovery import table_transaction
    from airflow_eo.iceberg.sink import IcebergTableAdapter

    def snapshot(snapshot_id: int, parent: int | None, **summary: str) -> Snapshot:
        return Snapshot(snapshot_id=snapshot_id, parent_snapshot_id=parent, sequence_number=snapshot_id,
                        timestamp_ms=snapshot_id, manifest_list=f"{tmp_path}/m{snapshot_id}.avro",
                        summary=Summary(Operation.APPEND, **summary), schema_id=0)

    ours = {"airflow-eo.pipeline": "p", "airflow-eo.batch": "3", "airflow-eo.app-id": "airflow_eo.p"}
    history = [snapshot(1, None, **ours), snapshot(2, 1, **{**ours, "airflow-eo.batch": "three"}),
               snapshot(3, 2, **{"source-snapshot-id": "x", "published-wap-id": "airflow_eo.p@4"})]
    empty = new_table_metadata(Schema(), UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, str(tmp_path), {})
    metadata = empty.model_copy(update={"snapshots": history, "current_snapshot_id": 3})
    adapter = IcebergTableAdapter("p", name="IcebergTableSink", table="l.d.t", location=str(tmp_path))
    adapter.metadata = lambda: metadata  # type: ignore[method-assign]
    assert adapter.committed_versions() == {"airflow_eo.p": 4}
    assert adapter._has(table_transaction("p", 4, None)) and not adapter._has(table_transaction("p", 5, None))

    forged = metadata.model_copy(update={"snapshots": [*history, snapshot(4, 3, **{**ours, "airflow-eo.batch":
                                                                                    "1000000"})],
                                         "current_snapshot_id": 4})
    adapter.metadata = lambda: forged  # type: ignore[method-assign]
    with pytest.raises(TableMarkerError, match="claims batch 1000000 of airflow_eo.p, above the newest batch"):
        adapter._has(table_transaction("p", 5, None))


def test_the_newest_metadata_is_found_past_a_stale_version_hint(tmp_path):
    """Two committers write version-hint.text after their commits: the slower one may leave an older version in it."""
    from airflow_eo.iceberg.sink import latest_metadata_file

    (tmp_path / "metadata").mkdir()
    for version in (1, 2, 3):
        (tmp_path / "metadata" / f"v{version}.metadata.json").write_text("{}")
    (tmp_path / "metadata" / "version-hint.text").write_text("2")
    assert latest_metadata_file(str(tmp_path)) == f"{tmp_path}/metadata/v3.metadata.json"
    with pytest.raises(FileNotFoundError):
        latest_metadata_file(str(tmp_path / "none"))
