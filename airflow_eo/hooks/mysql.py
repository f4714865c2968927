"""MySQL / MariaDB connections for the offset store and the sinks (Airflow ``mysql`` connections)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_eo.core.drivers import require_driver
from airflow_eo.hooks.connected_sinks import AirflowConnectionResolver


class EoMySqlHook(BaseHook):
    """Reads an Airflow ``mysql`` connection into pymysql arguments (the password never reaches logs).

    :param mysql_conn_id: the connection id (default ``mysql_default``). Its extra may set
        ``connect_timeout``, ``read_timeout`` and ``write_timeout`` (seconds, see
        :data:`airflow_eo.mysql.connection.TIMEOUTS`) and ``ssl``.
    """

    conn_name_attr = "mysql_conn_id"
    default_conn_name = "mysql_default"
    conn_type = "mysql"
    hook_name = "MySQL (airflow_eo)"

    def __init__(self, mysql_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.mysql_conn_id = mysql_conn_id

    def get_connect_kwargs(self) -> dict[str, Any]:
        require_driver("mysql")  # the connection module imports the driver: without it, the extra to install
        from airflow_eo.mysql.connection import connect_kwargs

        return connect_kwargs(AirflowConnectionResolver().connection(self.mysql_conn_id))


# The offset store is no MySQL thing any more (its connection type chooses the database); kept importable here.
from airflow_eo.hooks.offset_store import OffsetStoreHook  # noqa: E402

__all__ = ["EoMySqlHook", "OffsetStoreHook"]
