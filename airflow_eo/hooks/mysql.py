"""MySQL / MariaDB connections for the offset store and the sinks (Airflow ``mysql`` connections)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_eo.mysql.store import MySqlOffsetStore

# Seconds, overridable in the connection's extra: connecting; waiting for one statement's answer
# (longer than innodb_lock_wait_timeout and than the largest multi-row statement); sending one.
TIMEOUTS = {"connect_timeout": 10, "read_timeout": 600, "write_timeout": 600}

class EoMySqlHook(BaseHook):
    """Reads an Airflow ``mysql`` connection into pymysql arguments (the password never reaches logs).

    :param mysql_conn_id: the connection id (default ``mysql_default``). Its extra may set
        ``connect_timeout``, ``read_timeout`` and ``write_timeout`` (seconds, see ``TIMEOUTS``).
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
        }
        extra = conn.extra_dejson
        # A server that stops answering (a crash that leaves the socket open, a network partition)
        # fails the attempt after these seconds instead of hanging it; the next attempt recovers.
        for name, default in TIMEOUTS.items():
            kwargs[name] = int(extra.get(name, default))
        if extra.get("ssl"):
            kwargs["ssl"] = extra["ssl"]
        return kwargs


class OffsetStoreHook(EoMySqlHook):
    """The durable offset store on a ``mysql`` connection (default ``eo_offset_store``).

    See ``docs/architecture.md``, "The offset store".
    """

    default_conn_name = "eo_offset_store"
    hook_name = "airflow_eo offset store"

    def __init__(self, mysql_conn_id: str = default_conn_name) -> None:
        super().__init__(mysql_conn_id)

    def get_store(self) -> MySqlOffsetStore:
        return MySqlOffsetStore(self.get_connect_kwargs())

    def committed_offsets(self, pipeline_id: str) -> dict[tuple[str, int], int]:
        """The next offset to process per ``(topic, partition)``, as the pipeline's committed batches left it.

        :param pipeline_id: the pipeline.
        """
        return self.get_store().committed_offsets(pipeline_id)

    def committed_batch_id(self, pipeline_id: str, after_batch_id: int = -1,
                           interval: list[str] | None = None) -> int | None:
        """The id of a committed batch newer than ``after_batch_id`` or, with ``interval``, of that
        interval's batch once committed; None while there is none.

        :param pipeline_id: the pipeline.
        :param after_batch_id: only a committed batch id greater than this counts; -1 = any.
            Not used with ``interval``.
        :param interval: ISO-8601 start and end of an interval-mode batch (a run's data interval).
        """
        from datetime import datetime

        from airflow_eo.core.planning import Interval
        from airflow_eo.core.states import BatchState

        store = self.get_store()
        if interval is not None:
            start, end = (datetime.fromisoformat(t) for t in interval)
            batch = store.batch_for_interval(pipeline_id, Interval(start, end))
            return batch.batch_id if batch is not None and batch.state == BatchState.COMMITTED else None
        latest = store.latest_committed_batch_id(pipeline_id)
        return latest if latest is not None and latest > after_batch_id else None
