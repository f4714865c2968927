"""An output column the table lacks (real Kafka, Spark, MariaDB and PostgreSQL): the batch fails before any write,
naming the column and the exact ``ALTER TABLE`` to run; with ``add_missing_columns=True`` the column is added
(nullable, typed from Spark) before the write, and adding it again (a retry after a crash) changes nothing."""

from __future__ import annotations

import re
import uuid

import pytest

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.sinks import MySqlUpsertSink, PostgresUpsertSink
from examples.page_views import produce_page_views
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, rows, run
from tests.support.postgres import pg_rows

# The table lacks user_id (STRING) and ts (TIMESTAMP) of the page views' schema.
DDL = "CREATE TABLE {name} (event_id VARCHAR(64) NOT NULL PRIMARY KEY, app_id VARCHAR(64) NOT NULL)"


@pytest.mark.parametrize("database", ["mysql", "postgres"])
def test_new_columns_are_refused_with_the_alter_table_or_added_on_request(database, bootstrap, mysql_kwargs,
                                                                         postgres_kwargs, airflow_db):
    topic = create_topic(bootstrap, f"newcol_{database}_{uuid.uuid4().hex[:8]}", 2)
    table = f"newcol_{uuid.uuid4().hex[:8]}"
    if database == "mysql":
        sql, spec, columns_sql = (lambda q: rows(mysql_kwargs, q)), MySqlUpsertSink, (
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            f"WHERE table_schema = DATABASE() AND table_name = '{table}' ORDER BY ordinal_position")
    else:
        sql, spec, columns_sql = (lambda q: pg_rows(postgres_kwargs, q)), PostgresUpsertSink, (
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            f"WHERE table_name = '{table}' ORDER BY ordinal_position")
    sql(DDL.format(name=table))
    events = produce_page_views(bootstrap, 50, topic=topic)
    pipeline = f"newcol_{topic}"

    with pytest.raises(ConfigurationError, match="user_id, ts that table .* lacks") as refused:
        run(operator(topic, spec(table=table, key_columns=["event_id"]), pipeline_id=pipeline))
    assert sql(f"SELECT COUNT(*) FROM {table}")[0][0] == 0, "nothing may be written"
    statements = re.search(r"Run: (.*); or set add_missing_columns=True", str(refused.value))
    assert statements, str(refused.value)
    assert statements[1].count("ALTER TABLE") == 2 and "user_id" in statements[1] and "ts" in statements[1]

    summary = run(operator(topic, spec(table=table, key_columns=["event_id"], add_missing_columns=True),
                           pipeline_id=pipeline))
    assert summary["rows_out"] == 50
    columns = {name.lower(): (str(kind).lower(), nullable) for name, kind, nullable in sql(columns_sql)}
    assert columns["user_id"][1] == "YES" and columns["ts"][1] == "YES"
    assert columns["user_id"][0] in ("longtext", "text")
    assert columns["ts"][0] in ("datetime", "timestamp with time zone")
    written = {r[0]: r[1] for r in sql(f"SELECT event_id, user_id FROM {table}")}
    assert written == {e["event_id"]: e["user_id"] for e in events}

    # The statements the refusal named run as they are, and are harmless where the column already exists on
    # PostgreSQL (IF NOT EXISTS); a retry's adapter finds the columns there and adds nothing.
    if database == "postgres":
        for statement in statements[1].split("; "):
            sql(statement)
    produce_page_views(bootstrap, 10, topic=topic)
    summary = run(operator(topic, spec(table=table, key_columns=["event_id"], add_missing_columns=True),
                           pipeline_id=pipeline))
    assert summary["rows_out"] == 10 and sql(f"SELECT COUNT(*) FROM {table}")[0][0] == 60
