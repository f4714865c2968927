"""``airflow eo`` finds a pipeline whose offset store is not the default one (issue 44, item 6): without
``--offset-store-conn-id``, a command on a pipeline the default store does not know looks in every other listable
``mysql`` / ``postgres`` connection holding our tables (read-only), uses the one store that knows it and says so; a
pipeline no store knows fails naming the connections it looked in and the option to give. No Spark, no Kafka."""

from __future__ import annotations

import uuid

from airflow_eo.hooks.offset_store import OffsetStoreHook
from tests.support.cli import eo
from tests.support.operator_harness import rows


def test_a_pipeline_in_another_store_is_found_and_an_unknown_one_names_the_connections_looked_in(
        mysql_kwargs, monkeypatch):
    suffix = uuid.uuid4().hex[:8]
    database = conn_id = f"eo_elsewhere_{suffix}"
    bare = f"eo_bare_{suffix}"  # a database without our tables: looked at, never migrated
    rows(mysql_kwargs, f"CREATE DATABASE {database}")
    rows(mysql_kwargs, f"CREATE DATABASE {bare}")
    k = mysql_kwargs
    server = f"mysql://{k['user']}:{k['password']}@{k['host']}:{k['port']}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", f"{server}/{database}")
    monkeypatch.setenv(f"AIRFLOW_CONN_{bare.upper()}", f"{server}/{bare}")
    try:
        pipeline = f"elsewhere_{suffix}"
        OffsetStoreHook(conn_id).get_store().take_pipeline(pipeline)

        found = eo("history", pipeline)
        assert found.returncode == 0, found.stdout[-2000:] + found.stderr[-2000:]
        assert f"is in the offset store of connection '{conn_id}'" in found.stderr, found.stderr
        assert eo("history", pipeline, "--offset-store-conn-id", conn_id).returncode == 0

        missing = eo("history", f"nowhere_{suffix}")
        assert missing.returncode != 0
        assert f"the offset store has no pipeline 'nowhere_{suffix}'" in missing.stderr, missing.stderr
        assert conn_id in missing.stderr and bare in missing.stderr and "--offset-store-conn-id" in missing.stderr
        assert rows(mysql_kwargs, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s",
                    (bare,)) == [(0,)], "a database without our tables must not be migrated by a look-up"
    finally:
        rows(mysql_kwargs, f"DROP DATABASE IF EXISTS {database}")
        rows(mysql_kwargs, f"DROP DATABASE IF EXISTS {bare}")
