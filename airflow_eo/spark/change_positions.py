"""The change-position table's rows in Spark (``changes="debezium"``, :mod:`airflow_eo.sqlsink.change_positions`):
made from the written changes by a job of their own or by the write tasks themselves (:class:`TaskPositions`),
written per task in its own branch / fenced transaction, and the bounded purge of old delete markers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_eo.core.abilities import ChangePositions
from airflow_eo.core.batch import PartitionWriter, TaskPositions
from airflow_eo.core.changes import CHANGE_POSITION_KEY, DEFAULT_DELETE_RETENTION, POSITION_COLUMN, position_partition
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.spark.changes import KEY_ID

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)


def position_rows(changes: DataFrame, pipeline_id: str, batch_id: int) -> DataFrame:
    """The written changes as rows of the change-position table (``sqlsink/change_positions.py``)."""
    from pyspark.sql import functions as F

    return changes.where(F.col("_eo_error").isNull()).select(
        F.lit(bytearray(seen_pipeline_key(pipeline_id))).alias("pipeline_key"), F.col(KEY_ID).alias("key_id"),
        F.col(POSITION_COLUMN).alias("position"), F.col(DELETE_COLUMN).cast("int").alias("deleted"),
        _changed_ms().alias("changed_at"), F.lit(batch_id).cast("long").alias("batch_id"))


#: What a write task needs of each change besides the output's columns to record its position
#: (:func:`task_position_columns`, :func:`task_position_table`).
CHANGED_MS = "_eo_changed_ms"
TASK_POSITION_COLUMNS = (KEY_ID, POSITION_COLUMN, CHANGED_MS)


def _changed_ms() -> Column:
    """The change's Kafka timestamp in epoch ms (a delete marker's age, for its retention)."""
    from pyspark.sql import functions as F

    return F.floor(F.unix_micros(F.col("kafka_timestamp")) / 1000).cast("long")


def task_position_columns() -> list[Column]:
    """:data:`TASK_POSITION_COLUMNS` of the changes (:func:`newest_changes`' output), carried to the write tasks."""
    from pyspark.sql import functions as F

    return [F.col(KEY_ID), F.col(POSITION_COLUMN), _changed_ms().alias(CHANGED_MS)]


def task_position_table(written: Sequence[Any], positions: TaskPositions) -> Any:
    """The rows of the change-position table of the changes one write task wrote (``written``: Arrow batches of
    them with :data:`TASK_POSITION_COLUMNS` and :data:`DELETE_COLUMN`, at least one), as :func:`position_rows` makes
    them. Runs in the Spark task."""
    import pyarrow as pa

    table = pa.Table.from_batches(written)
    count = table.num_rows
    return pa.table({
        "pipeline_key": pa.array([seen_pipeline_key(positions.pipeline_id)] * count, pa.binary()),
        "key_id": table.column(KEY_ID), "position": table.column(POSITION_COLUMN),
        "deleted": table.column(DELETE_COLUMN).cast(pa.int32()), "changed_at": table.column(CHANGED_MS),
        "batch_id": pa.array([positions.batch_id] * count, pa.int64())})


@dataclass(frozen=True)
class PositionPartitions:
    """The change-position table's writer run as a job's partition writer, numbered apart
    (:func:`~airflow_eo.core.changes.position_partition`): its branches never take the place of the output's, the
    dead letters' or the seen ids' of the same partition numbers."""

    writer: PartitionWriter

    @property
    def key_columns(self) -> tuple[str, ...]:
        return CHANGE_POSITION_KEY

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        import pyarrow as pa

        received = list(batches)  # in key order: the table's index takes them page after page (ids are hashes)
        ordered = pa.Table.from_batches(received).sort_by("key_id").to_batches() if received else []
        return self.writer(ordered, position_partition(partition), stage_id, attempt_id, agreed)


def purge_delete_markers(changes: ChangePositions, pipeline_id: str, limit: int) -> None:
    """Remove at most ``limit`` delete markers past their retention (by the change's Kafka timestamp), in the
    sink's own transaction: a purge that waits on another pipeline's locks costs the batch nothing else."""
    cutoff = int((time.time() - DEFAULT_DELETE_RETENTION.total_seconds()) * 1000)
    try:
        purged = changes.purge_delete_markers(pipeline_id, cutoff, limit)
        if purged:
            log.info("changes: %s delete marker(s) past retention removed", purged)
    except Exception:
        log.warning("changes: could not remove delete markers past retention (the next batch tries again)",
                    exc_info=True)
