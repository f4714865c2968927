"""PostgreSQL connections for the offset store and the sinks (Airflow ``postgres`` connections, as
apache-airflow-providers-postgres defines them: ``schema`` is the database)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_eo.core.drivers import require_driver
from airflow_eo.hooks.connected_sinks import AirflowConnectionResolver


class EoPostgresHook(BaseHook):
    """Reads an Airflow ``postgres`` connection into psycopg arguments (the password never reaches logs).

    :param postgres_conn_id: the connection id (default ``postgres_default``). Its extra may set libpq's
        ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, ``connect_timeout`` and TCP keepalives
        (:data:`airflow_eo.postgres.connection.EXTRA_PARAMETERS`).
    """

    conn_name_attr = "postgres_conn_id"
    default_conn_name = "postgres_default"
    conn_type = "postgres"
    hook_name = "PostgreSQL (airflow_eo)"

    def __init__(self, postgres_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.postgres_conn_id = postgres_conn_id

    def get_connect_kwargs(self) -> dict[str, Any]:
        require_driver("postgres")  # the connection module imports the driver: without it, the extra to install
        from airflow_eo.postgres.connection import connect_kwargs

        return connect_kwargs(AirflowConnectionResolver().connection(self.postgres_conn_id))
