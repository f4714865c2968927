"""The Spark conf a pipeline's session starts with: the user's, with what its sink asks for
(:meth:`~airflow_eo.core.sink_kinds.SinkSpec.spark_conf`: a table format's package and SQL extension)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_eo.core.sink_kinds import SinkSpec

#: Keys (or values) of Spark conf that hold a secret: Spark's own redaction
#: (``(?i)secret|password|token|access[.]?key``)
#: misses an Iceberg REST catalog's ``credential`` (``id:secret``) and a catalog's file-system keys
#: (``s3.access-key-id``, ``adls.account-key``). Our sessions start with it in ``spark.redaction.regex`` (the
#: Environment tab, the event log) and in ``spark.sql.redaction.options.regex`` (the SQL tab's and the event log's
#: per-query conf, a SQL conf that a Spark Connect session sets too).
SECRET_CONF_PATTERN = (r"(?i)secret|password|token|credential|access[._-]?key|account[._-]?key|private[._-]?key"
                       r"|sas[._-]?key|session[._-]?key")
#: Spark's default for ``spark.sql.redaction.options.regex`` (a URL may hold a user and password).
SPARK_SQL_REDACTION_DEFAULT = "(?i)url"


def with_secret_redaction(pattern: str | None) -> str:
    """A redaction regex that also matches :data:`SECRET_CONF_PATTERN` (``pattern`` kept: Spark redacts what
    either part matches)."""
    if pattern and SECRET_CONF_PATTERN in pattern:
        return pattern
    return f"{pattern}|{SECRET_CONF_PATTERN}" if pattern else SECRET_CONF_PATTERN


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
