"""PostgreSQL for the tests: its offset store's connection id, the sinks' tables, rows, prepared transactions and
the store's batches."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

from airflow_eo.core.xid import pipeline_key
from tests.support.operator_harness import rows

PG_STORE = "eo_pg_store"

EVENTS_DDL = ("CREATE TABLE {name} (event_id VARCHAR(64) NOT NULL PRIMARY KEY, app_id VARCHAR(64) NOT NULL, "
              "user_id VARCHAR(64) NULL, ts TIMESTAMP(3) NULL)")
COUNTS_DDL = "CREATE TABLE {name} (app_id VARCHAR(64) NOT NULL PRIMARY KEY, pv BIGINT NOT NULL)"


def pg_rows(postgres_kwargs: dict[str, Any], sql: str, args: tuple = ()) -> list[tuple]:
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def pg_table(postgres_kwargs: dict[str, Any], ddl: str, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    pg_rows(postgres_kwargs, ddl.format(name=name))
    return name


def prepared_gids(postgres_kwargs: dict[str, Any], pipeline: str) -> list[str]:
    """The pipeline's prepared transactions, read straight from pg_prepared_xacts."""
    return [r[0] for r in pg_rows(postgres_kwargs, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                                  (f"eo:{pipeline_key(pipeline)}:%",))]


def store_batches(store: str, postgres_kwargs: dict[str, Any], mysql_kwargs: dict[str, Any],
                  pipeline: str) -> list[dict[str, Any]]:
    sql = "SELECT batch_id, state, ranges, summary FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id"
    found = pg_rows(postgres_kwargs, sql, (pipeline,)) if store == PG_STORE else rows(mysql_kwargs, sql, (pipeline,))
    return [{"batch_id": b, "state": s, "ranges": json.loads(r) if isinstance(r, str) else r,
             "summary": json.loads(m) if isinstance(m, str) else m} for b, s, r, m in found]
