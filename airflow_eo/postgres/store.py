"""The durable offset store on PostgreSQL: the SQL store (``airflow_eo/sqlstore``) over psycopg connections, with
PostgreSQL's migrations and spellings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.rows import dict_row

from airflow_eo.postgres import migrations
from airflow_eo.postgres.connection import connect
from airflow_eo.postgres.migrations import migrate
from airflow_eo.sqlstore.dialect import POSTGRES
from airflow_eo.sqlstore.store import SqlOffsetStore


class PostgresOffsetStore(SqlOffsetStore):
    """The offset store on PostgreSQL (the store's connection has Airflow's ``postgres`` type).

    :param connect_kwargs: psycopg arguments (:func:`airflow_eo.postgres.connection.connect_kwargs`).
    """

    dialect = POSTGRES

    def __init__(self, connect_kwargs: dict[str, Any]) -> None:
        self._connect_kwargs = connect_kwargs

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor[dict[str, Any]]]:
        """One connection, one transaction (READ COMMITTED: every statement sees what committed before it, as the
        compare-and-sets after the fence's lock need): committed on success, rolled back on error."""
        conn = connect(self._connect_kwargs, autocommit=False, row_factory=dict_row)
        try:
            with conn.cursor() as cur:
                yield cur
            conn.commit()
        except BaseException:
            # Best effort: on a lost connection the server rolls back by itself, and a failing ROLLBACK must not
            # hide the error that says what happened.
            with suppress(psycopg.Error):
                conn.rollback()
            raise
        finally:
            conn.close()

    def _migrate(self, cur: Any) -> None:
        migrate(cur)

    def _latest_schema_version(self) -> int:
        return max(version for version, _ in migrations.MIGRATIONS)
