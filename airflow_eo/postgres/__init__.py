"""The postgres integration: its offset store (and sink kinds) registered once, here.

Cheap to import: the factories import psycopg and the adapters when a run builds one.
"""

from __future__ import annotations

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.stores import PipelineLedger, register_store


def _store(connection: ConnectionInfo) -> PipelineLedger:
    from airflow_eo.postgres.connection import connect_kwargs
    from airflow_eo.postgres.store import PostgresOffsetStore

    return PostgresOffsetStore(connect_kwargs(connection))


register_store("postgres", _store)
