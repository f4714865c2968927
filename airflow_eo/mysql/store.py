"""The durable offset store on MySQL / MariaDB: the SQL store (``airflow_eo/sqlstore``) over the room's descriptor
(pymysql connections, MySQL's migrations and spellings)."""

from __future__ import annotations

from airflow_eo.mysql.database import DATABASE
from airflow_eo.sqlstore.store import SqlOffsetStore


class MySqlOffsetStore(SqlOffsetStore):
    """The offset store on MySQL / MariaDB.

    :param connect_kwargs: keyword arguments for ``pymysql.connect`` (from an Airflow ``mysql`` connection,
        :func:`airflow_eo.mysql.connection.connect_kwargs`).
    """

    database = DATABASE
