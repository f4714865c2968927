"""The mysql integration: its sink kinds (and offset store) registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factories import the adapters and the
driver, pymysql (the ``mysql`` extra), when a run builds one.
"""

from __future__ import annotations

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.drivers import Driver, register_driver
from airflow_eo.core.sink_kinds import register_sink
from airflow_eo.core.stores import ManagedOffsetStore, register_store
from airflow_eo.mysql.specs import MySqlUpsertSink, MySqlXaSink, build_upsert, build_xa
from airflow_eo.sqlsink.specs import two_phase_capabilities, upsert_capabilities


def _describe(exc: BaseException) -> str:
    """pymysql's error as its message (its args are ``(code, message)``)."""
    return str(exc.args[-1]) if exc.args else str(exc)


# Not imported here: without the driver (``pip install 'airflow-eo[mysql]'``) the kinds still register, and a use
# of one fails with a clear error.
register_driver(Driver("mysql", "MySQL / MariaDB", "pymysql", ("err.MySQLError",), extra="mysql",
                       describe=_describe))
register_sink(MySqlUpsertSink, upsert_capabilities("mysql"), build_upsert)
register_sink(MySqlXaSink, two_phase_capabilities("mysql"), build_xa)


def _store(connection: ConnectionInfo) -> ManagedOffsetStore:
    from airflow_eo.mysql.connection import connect_kwargs
    from airflow_eo.mysql.database import DATABASE
    from airflow_eo.sqlstore.store import SqlOffsetStore

    return SqlOffsetStore(DATABASE, connect_kwargs(connection))


register_store("mysql", _store)
