"""Where Spark runs: a ``spark`` connection (master URL), a ``spark_connect`` one, or local[*]."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook

from airflow_eo.adapters.spark_session import get_session


class SparkSessionHook(BaseHook):
    """Builds the SparkSession for a micro-batch.

    :param spark_conn_id: a ``spark`` connection (host = master URL such as ``local[4]``,
        ``spark://host:7077``, ``yarn``; extra ``{"conf": {...}}``) or a ``spark_connect``
        one (host and port of the Spark Connect server). None: ``AIRFLOW_EO_SPARK_MASTER``
        or ``local[*]``.
    :param conf: Spark conf that overrides the connection's.
    """

    conn_name_attr = "spark_conn_id"
    default_conn_name = "spark_default"
    conn_type = "spark"
    hook_name = "Spark (airflow_eo)"

    def __init__(self, spark_conn_id: str | None = None, conf: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.spark_conn_id = spark_conn_id
        self.conf = dict(conf or {})

    def get_session_args(self) -> dict[str, Any]:
        if not self.spark_conn_id:
            return {"master": os.environ.get("AIRFLOW_EO_SPARK_MASTER", "local[*]"), "conf": self.conf}
        conn = self.get_connection(self.spark_conn_id)
        conf = {**conn.extra_dejson.get("conf", {}), **self.conf}
        if conn.conn_type == "spark_connect":
            host = (conn.host or "localhost").removeprefix("sc://")
            return {"remote": f"sc://{host}:{conn.port or 15002}", "conf": conf}
        master = conn.host or "local[*]"
        if conn.port and "://" in master:
            master = f"{master}:{conn.port}"
        return {"master": master, "conf": conf}

    def get_conn(self):
        return get_session(**self.get_session_args())
