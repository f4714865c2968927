"""Where Spark runs: a ``spark`` connection (master URL), a ``spark_connect`` one, or local[*]."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark.session import get_session
from airflow_eo.spark.spark_connect import connect_url, spellings


class SparkSessionHook(BaseHook):
    """Builds the SparkSession for a micro-batch.

    The Airflow task is the Spark driver (client mode) or a thin Spark Connect client; what the
    executors run of ours is shipped with the session (see ``spark_session.get_session``).

    :param spark_conn_id: a ``spark`` connection, as apache-airflow-providers-apache-spark
        defines it (host = master: ``spark://host`` with the port in ``port``, ``yarn``,
        ``k8s://https://host``, ``local[4]``; extra ``deploy-mode`` must be ``client`` — Spark 4
        refuses cluster deploy mode for Python on standalone, and the task must be the driver —
        and ``{"conf": {...}}`` for Spark conf), or a ``spark_connect`` connection (host, port,
        login = user id, password = token, extra ``use_ssl``), turned into its URL by the Spark
        provider's ``SparkConnectHook``. None: ``AIRFLOW_EO_SPARK_MASTER`` or ``local[*]``.
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
        extra = conn.extra_dejson
        conf = {**extra.get("conf", {}), **self.conf}
        if conn.conn_type == "spark_connect":
            # The Spark provider's fields (login = user id, password = token, extra use_ssl), encoded so that any
            # token works: the provider leaves a token's "/" as is, which pyspark refuses, echoing the token.
            # Airflow masks the token as stored; its encoded spellings are masked too, wherever they surface.
            for spelling in spellings(conn.password or ""):
                mask_secret(spelling)
            return {"remote": connect_url(conn.host or "localhost", conn.port, conn.login, conn.password,
                                          extra.get("use_ssl")), "conf": conf}
        deploy_mode = extra.get("deploy-mode") or extra.get("deploy_mode") or "client"
        if deploy_mode != "client":
            raise ConfigurationError(
                f"spark connection {self.spark_conn_id!r} has deploy-mode={deploy_mode!r}: a micro-batch runs its "
                "Spark driver inside the Airflow task (client mode), and Spark 4 refuses cluster deploy mode for "
                "Python applications on standalone clusters. Set deploy-mode to 'client', or use a spark_connect "
                "connection to run the driver elsewhere."
            )
        master = conn.host or "local[*]"
        if conn.port and "://" in master:
            master = f"{master}:{conn.port}"
        return {"master": master, "conf": conf}

    def is_connect(self) -> bool:
        """True when the connection is a Spark Connect server (its session is cheap to open)."""
        return "remote" in self.get_session_args()

    def get_conn(self):
        return get_session(**self.get_session_args())
