"""The postgres integration: its sink kinds and offset store registered once, here.

Cheap to import: the factories import the adapters and the driver, psycopg (the ``postgres`` extra), when a run
builds one.
"""

from __future__ import annotations

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.drivers import Driver, register_driver
from airflow_eo.core.sink_kinds import register_sink
from airflow_eo.core.stores import ManagedOffsetStore, register_store
from airflow_eo.postgres.specs import PostgresTwoPhaseSink, PostgresUpsertSink, build_two_phase, build_upsert
from airflow_eo.sqlsink.specs import two_phase_capabilities, upsert_capabilities

# Not imported here: without the driver (``pip install 'airflow-eo[postgres]'``) the kinds still register, and a use
# of one fails with a clear error.
register_driver(Driver("postgres", "PostgreSQL", "psycopg", ("Error",), extra="postgres"))
register_sink(PostgresUpsertSink, upsert_capabilities("postgres"), build_upsert)
register_sink(PostgresTwoPhaseSink, two_phase_capabilities("postgres"), build_two_phase)


def _store(connection: ConnectionInfo) -> ManagedOffsetStore:
    from airflow_eo.postgres.connection import connect_kwargs
    from airflow_eo.postgres.database import DATABASE
    from airflow_eo.sqlstore.store import SqlOffsetStore

    return SqlOffsetStore(DATABASE, connect_kwargs(connection))


register_store("postgres", _store)
