"""The Spark conf a pipeline's session starts with: the user's, with what its sink asks for
(:meth:`~airflow_eo.core.sinks.SinkSpec.spark_conf`: a table format's package and SQL extension)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_eo.core.sinks import SinkSpec

#: Spark conf keys whose value is a comma-separated list: a sink's entries are added to the user's, not replaced.
SPARK_LIST_CONF = ("spark.sql.extensions", "spark.jars.packages", "spark.jars")


def with_sink_spark_conf(spec: SinkSpec, conf: Mapping[str, Any]) -> dict[str, Any]:
    """The user's Spark conf with what ``spec`` needs (:meth:`SinkSpec.spark_conf`): the user's value wins, except
    for list-valued keys (:data:`SPARK_LIST_CONF`), where the sink's entries missing from the user's are appended."""
    merged = {**spec.spark_conf(), **conf}
    for key, needed in spec.spark_conf().items():
        if key in SPARK_LIST_CONF and key in conf:
            given = [v.strip() for v in str(conf[key]).split(",") if v.strip()]
            merged[key] = ",".join([*given, *(v for v in needed.split(",") if v not in given)])
    return merged
