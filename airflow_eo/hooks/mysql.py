"""MySQL / MariaDB connections for the offset store and the sinks (Airflow ``mysql`` connections)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_eo.adapters.mysql_sink import MySqlTarget, MySqlUpsertAdapter, MySqlXaAdapter
from airflow_eo.adapters.offset_store import OffsetStore
from airflow_eo.sinks import MySqlUpsertSink


class EoMySqlHook(BaseHook):
    """Reads an Airflow ``mysql`` connection into pymysql arguments (the password never reaches logs).

    :param mysql_conn_id: the connection id (default ``mysql_default``).
    """

    conn_name_attr = "mysql_conn_id"
    default_conn_name = "mysql_default"
    conn_type = "mysql"
    hook_name = "MySQL (airflow_eo)"

    def __init__(self, mysql_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.mysql_conn_id = mysql_conn_id

    def get_connect_kwargs(self) -> dict[str, Any]:
        conn = self.get_connection(self.mysql_conn_id)
        kwargs: dict[str, Any] = {
            "host": conn.host or "localhost",
            "port": int(conn.port or 3306),
            "user": conn.login or "",
            "password": conn.password or "",
            "database": conn.schema or None,
            "connect_timeout": 10,
        }
        extra = conn.extra_dejson
        if extra.get("ssl"):
            kwargs["ssl"] = extra["ssl"]
        return kwargs

    def get_sink_adapter(self, sink: MySqlUpsertSink) -> MySqlUpsertAdapter:
        target = MySqlTarget(self.get_connect_kwargs(), sink.table, tuple(sink.key_columns), dict(sink.updates),
                             sink.rows_per_statement, sink.dead_letter_table)
        return (MySqlXaAdapter if sink.transactional else MySqlUpsertAdapter)(target)


class OffsetStoreHook(EoMySqlHook):
    """The durable offset store (DESIGN §2) on a ``mysql`` connection (default ``eo_offset_store``)."""

    default_conn_name = "eo_offset_store"
    hook_name = "airflow_eo offset store"

    def __init__(self, mysql_conn_id: str = default_conn_name) -> None:
        super().__init__(mysql_conn_id)

    def get_store(self) -> OffsetStore:
        return OffsetStore(self.get_connect_kwargs())
