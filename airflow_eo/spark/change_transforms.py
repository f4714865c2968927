"""A transform over a change stream's batch (``changes=`` with ``transform=``): what it sees of each change, and its
output made the changes the sink applies. Apart from :mod:`airflow_eo.spark.changes` (the parse and the newest
change per key), which it only names columns of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_eo.core.changes import CHANGE_OP, CHANGE_POSITION, DELETE_OP, POSITION_COLUMN
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark.changes import SKIP

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


#: What a transform sees of a change besides the row's columns (the position as its 32 hex digits).
def transform_columns() -> list[Column]:
    from pyspark.sql import functions as F

    return [F.col(CHANGE_OP), F.lower(F.hex(F.col(POSITION_COLUMN))).alias(CHANGE_POSITION)]


def transform_changes(parsed: DataFrame, payload: Sequence[str], key_columns: Sequence[str],
                      transform: Callable[[DataFrame], DataFrame], metadata: Sequence[str]
                      ) -> tuple[DataFrame, list[str]]:
    """A transform over a batch's changes: it sees each good change's row columns, :data:`CHANGE_OP`,
    :data:`CHANGE_POSITION` (32 hex digits) and the record's metadata columns, and returns rows that keep the key
    columns, ``change_op`` and ``change_position`` (it may add, compute, rename or drop the others, and filter
    changes out). Its output becomes the changes the sink applies (a ``d`` deletes the row of its key), beside the
    batch's bad and skipped records, untouched: ``(the changes, their payload columns)``."""
    from pyspark.sql import functions as F

    good = parsed.where(F.col("_eo_error").isNull() & ~F.col(SKIP))
    row = [c for c in payload if c != DELETE_COLUMN]
    seen = good.select(*[F.col(f"`{c}`") for c in row], *transform_columns(), *[F.col(c) for c in metadata])
    out = transform(seen)
    missing = [c for c in (*key_columns, CHANGE_OP, CHANGE_POSITION) if c not in out.columns]
    if missing:
        raise ConfigurationError(
            f"changes: the transform's output lacks {', '.join(missing)}; it has {', '.join(out.columns)}. A transform "
            f"over changes keeps the key column(s) {', '.join(key_columns)}, {CHANGE_OP} and {CHANGE_POSITION} as it "
            "got them (they say which row the change is of, whether it deletes it, and its order)")
    columns = [c for c in out.columns if c not in (CHANGE_OP, CHANGE_POSITION, *metadata)]
    kept = [c for c in metadata if c in out.columns]
    at = F.col("kafka_timestamp") if "kafka_timestamp" in out.columns else F.lit(None).cast("timestamp")
    changes = out.select(*[F.col(f"`{c}`") for c in columns], (F.col(CHANGE_OP) == DELETE_OP).alias(DELETE_COLUMN),
                         F.unhex(F.col(CHANGE_POSITION)).alias(POSITION_COLUMN),
                         *[F.col(c) for c in kept if c != "kafka_timestamp"],
                         F.coalesce(at, F.current_timestamp()).alias("kafka_timestamp"),
                         F.lit(None).cast("string").alias("_eo_error"), F.lit(False).alias(SKIP))
    # The bad and skipped records go on as they came (dead letters, a failed batch, or counted), without the row's
    # columns, which the transform may have given other types.
    others = parsed.where(F.col("_eo_error").isNotNull() | F.col(SKIP)).drop(*payload, POSITION_COLUMN, CHANGE_OP)
    return changes.unionByName(others, allowMissingColumns=True), [*columns, DELETE_COLUMN]
