"""The durable offset store on PostgreSQL: the SQL store (``airflow_eo/sqlstore``) over the room's descriptor (psycopg
connections, PostgreSQL's migrations and spellings)."""

from __future__ import annotations

from airflow_eo.postgres.database import DATABASE
from airflow_eo.sqlstore.store import SqlOffsetStore


class PostgresOffsetStore(SqlOffsetStore):
    """The offset store on PostgreSQL (the store's connection has Airflow's ``postgres`` type).

    :param connect_kwargs: psycopg arguments (:func:`airflow_eo.postgres.connection.connect_kwargs`).
    """

    database = DATABASE
