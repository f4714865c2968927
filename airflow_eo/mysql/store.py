"""The durable offset store on MySQL / MariaDB: the SQL store (``airflow_eo/sqlstore``) over pymysql connections,
with MySQL's migrations and spellings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT

from airflow_eo.mysql import connection as mysql_connection
from airflow_eo.mysql import migrations
from airflow_eo.mysql.migrations import migrate
from airflow_eo.sqlstore.dialect import MYSQL
from airflow_eo.sqlstore.store import SqlOffsetStore


class MySqlOffsetStore(SqlOffsetStore):
    """The offset store on MySQL / MariaDB.

    :param connect_kwargs: keyword arguments for ``pymysql.connect`` (from an Airflow ``mysql`` connection,
        :func:`airflow_eo.mysql.connection.connect_kwargs`).
    """

    dialect = MYSQL

    def __init__(self, connect_kwargs: dict[str, Any]) -> None:
        self._connect_kwargs = connect_kwargs

    @contextmanager
    def transaction(self) -> Iterator[pymysql.cursors.DictCursor]:
        """One connection, one transaction: committed on success, rolled back on error."""
        conn = mysql_connection.connect(
            self._connect_kwargs,
            autocommit=False,
            cursorclass=pymysql.cursors.DictCursor,
            # Affected rows = matched rows, so a compare-and-set that rewrites an
            # unchanged value (an empty range) still counts as a match.
            client_flag=CLIENT.FOUND_ROWS,
        )
        try:
            with conn.cursor() as cur:
                yield cur
            conn.commit()
        except BaseException:
            # Best effort: on a lost connection (the server crashed) the server rolls back by itself,
            # and a failing ROLLBACK must not hide the error that says what happened.
            with suppress(pymysql.err.MySQLError):
                conn.rollback()
            raise
        finally:
            conn.close()

    def _migrate(self, cur: Any) -> None:
        migrate(cur)

    def _latest_schema_version(self) -> int:
        return max(version for version, _ in migrations.MIGRATIONS)
