"""Lakehouse outputs in OpenLineage's dataset naming: a table of files is named by its location, as OpenLineage's
Spark integration names it (its ``FilesystemDatasetUtils`` and ``IcebergHandler`` tests are the reference), an
Iceberg table of a Hadoop catalog also by its catalog name (``symlinks``); the Airflow Assets stay as they were."""

from __future__ import annotations

import json
import os

import pytest
from openlineage.client.serde import Serde

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.lineage_names import location_dataset, location_namespace
from airflow_eo.operators import lineage
from airflow_eo.sinks import DeltaTableSink, IcebergTableSink, PostgresUpsertSink


@pytest.mark.parametrize(("location", "expected"), [
    ("/data/lake/app_pv", ("file", "/data/lake/app_pv")),
    ("/data/lake/app_pv/", ("file", "/data/lake/app_pv")),
    ("file:/data/lake/app_pv", ("file", "/data/lake/app_pv")),
    ("file:///data/lake/app_pv", ("file", "/data/lake/app_pv")),
    ("file://files.example/data/app_pv", ("file://files.example", "/data/app_pv")),
    ("s3a://lake/warehouse/app_pv/", ("s3://lake", "warehouse/app_pv")),
    ("s3://lake/app_pv", ("s3://lake", "app_pv")),
    ("gs://lake/app_pv", ("gs://lake", "app_pv")),
    ("hdfs://namenode:8020/lake/app_pv", ("hdfs://namenode:8020", "/lake/app_pv")),
    ("abfss://c@acct.dfs.core.windows.net/lake/t", ("abfss://c@acct.dfs.core.windows.net", "/lake/t")),
])
def test_a_location_is_named_as_the_spec_and_the_spark_integration_name_it(location, expected):
    assert location_dataset(location) == expected


def test_a_relative_path_is_named_by_its_absolute_path():
    # Spark writes a relative path under the driver's working folder, which is the task's.
    assert location_dataset("lake/app_pv") == ("file", os.path.join(os.getcwd(), "lake/app_pv"))


@pytest.mark.parametrize(("warehouse", "namespace"), [
    ("/tmp/warehouse", "file:/tmp/warehouse"),
    ("file:///tmp/warehouse/", "file:/tmp/warehouse"),
    ("hdfs://namenode:8020/tmp/warehouse", "hdfs://namenode:8020/tmp/warehouse"),
    ("s3a://lake/warehouse", "s3://lake/warehouse"),
])
def test_a_warehouse_as_a_namespace(warehouse, namespace):
    assert location_namespace(warehouse) == namespace


def as_sent(dataset: object) -> dict:
    return json.loads(Serde.to_json(dataset))


SUMMARY = {"pipeline_id": "p", "batch_id": 4, "run_id": "manual__x", "records_in": 10, "rows_out": 3,
           "dead_letters": 0, "duplicates": 2, "ranges": [{"topic": "t", "partition": 0, "from_offset": 5,
                                                           "until_offset": 15}]}


def test_a_delta_table_is_its_location_with_the_storage_facet():
    sink = DeltaTableSink(path="s3a://lake/tables/app_pv", key_columns=["app_id"])
    sent = lineage.completed("kafka://k:9092", ["t"], sink.lineage(None), SUMMARY)
    [out] = sent.outputs
    assert (out.namespace, out.name) == ("s3://lake", "tables/app_pv")
    facets = as_sent(out)["facets"]
    assert facets["storage"]["storageLayer"] == "delta" and "symlinks" not in facets
    assert as_sent(out.outputFacets["outputStatistics"])["rowCount"] == 3
    assert as_sent(sent.run_facets["airflowEoBatch"])["duplicates"] == 2
    assert sink.asset(None).uri == "s3a://lake/tables/app_pv"  # the Asset as before


def test_an_iceberg_table_of_a_catalog_connection_is_named_by_the_warehouse_it_knows():
    class Catalogs:
        def connection(self, conn_id: str) -> ConnectionInfo:
            return ConnectionInfo(conn_id, "postgres", extra={"warehouse": "s3a://lake/wh"} if conn_id == "wh" else {})

    named = IcebergTableSink(table="lake.db.t", catalog_conn_id="wh").lineage(Catalogs())  # type: ignore[arg-type]
    assert (named.namespace, named.name) == ("s3://lake", "wh/db/t")
    assert [(s.namespace, s.name) for s in named.symlinks] == [("s3://lake/wh", "db.t")]
    unknown = IcebergTableSink(table="lake.db.t", catalog_conn_id="none").lineage(Catalogs())  # type: ignore[arg-type]
    assert (unknown.namespace, unknown.name, unknown.symlinks) == ("iceberg://lake", "db.t", ())


def test_an_iceberg_table_is_its_location_and_its_catalog_name_a_symlink():
    sink = IcebergTableSink(table="lake.analytics.app_pv", warehouse="/data/warehouse")
    sent = lineage.failed("kafka://k:9092", ["t"], sink.lineage(None), "p", "manual__x", None)
    [out] = sent.outputs
    assert (out.namespace, out.name) == ("file", "/data/warehouse/analytics/app_pv")
    facets = as_sent(out)["facets"]
    assert facets["symlinks"]["identifiers"] == [
        {"namespace": "file:/data/warehouse", "name": "analytics.app_pv", "type": "TABLE"}]
    assert facets["storage"]["storageLayer"] == "iceberg"
    assert as_sent(sent.run_facets["airflowEoBatch"])["state"] == "not_planned"
    asset = sink.asset(None)  # the Asset keeps the catalog's name
    assert (asset.namespace, asset.name) == ("iceberg://lake", "analytics.app_pv")


def test_a_database_table_keeps_its_asset_naming():
    class Connections:
        def connection(self, conn_id):
            from airflow_eo.core.connections import ConnectionInfo

            return ConnectionInfo(conn_id=conn_id, conn_type="postgres", host="db", port=5432, login="u",
                                  password="x", schema="shop", extra={})

    sink = PostgresUpsertSink(table="orders", key_columns=["id"])
    named = sink.lineage(Connections())
    assert (named.namespace, named.name, named.symlinks, named.storage_layer) == (
        "postgres://db:5432", "shop.public.orders", (), None)
