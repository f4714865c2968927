"""A change stream merged into a table format (``changes="debezium"`` with ``DeltaTableSink`` / ``IcebergTableSink``
and ``key_columns``; :mod:`airflow_eo.core.changes`).

A table format commits one table at a time, and its commit is the batch's commit point; so a row's position must be
in the target table itself, written by the same commit: a column the sink adds (:data:`TABLE_POSITION_COLUMN`, to a
table created with the source's columns only too). One ``MERGE`` applies, per key, the batch's newest change when it
is newer than the row's position: an upsert of the row, or a delete.

A delete removes the row, so its position goes to a side table of delete markers beside the target (same format;
:data:`DELETE_MARKERS_SUFFIX`), which a later create older than the delete (re-sent, or a re-snapshot's stale read)
is checked against. The markers are written before the target's commit, in commits of their own: a marker states a
fact of the source's log (the key was deleted at that position), true whether or not this attempt commits, and it
only ever stops changes older than itself; the delete itself is applied by the target's MERGE of this batch, or of
the attempt that replays it. A marker is kept ``DEFAULT_DELETE_RETENTION`` (by the delete's Kafka timestamp).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_eo.core.changes import (
    CHANGED_AT,
    DEFAULT_DELETE_RETENTION,
    DELETED_AT,
    POSITION_COLUMN,
    TABLE_POSITION_COLUMN,
)
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import backquote as _q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
#: every how many batches the markers past retention are removed (a scan of the marker table, and a commit)
PURGE_EVERY = 10
_MARKER = "_eo_marker_position"


class ChangeTables:
    """The target and its delete-marker table, as Spark SQL names them, for one batch of changes.

    :param target: the target table's SQL name (``delta.`<path>```, ``catalog.db.table``).
    :param markers: the marker table's SQL name.
    :param using: the format (``delta``, ``iceberg``), for ``CREATE TABLE``.
    :param key_columns: the target's key.
    :param label: the sink kind's name, for messages.
    """

    def __init__(self, target: str, markers: str, using: str, key_columns: Sequence[str], label: str) -> None:
        self.target, self.markers, self.using = target, markers, using
        self.key_columns = tuple(key_columns)
        self.label = label

    def newest(self, out: DataFrame) -> DataFrame:
        """Per key, the batch's newest change by position: the row's columns, :data:`TABLE_POSITION_COLUMN`,
        :data:`DELETE_COLUMN` and :data:`DELETED_AT` (the target's schema, with the last two dropped)."""
        from pyspark.sql import functions as F

        missing = [c for c in (*self.key_columns, DELETE_COLUMN, POSITION_COLUMN, CHANGED_AT) if c not in out.columns]
        if missing:
            raise ConfigurationError(f"{self.label}: a batch of changes lacks column(s) {', '.join(missing)}; it has "
                                     f"{', '.join(out.columns)} (are key_columns columns of the schema?)")
        rows = [c for c in out.columns if c not in (DELETE_COLUMN, POSITION_COLUMN, CHANGED_AT)]
        carried = [c for c in out.columns if c not in self.key_columns]
        newest = out.groupBy(*self.key_columns).agg(
            F.max_by(F.struct(*[F.col(_q(c)) for c in carried]), F.col(POSITION_COLUMN)).alias("_eo_last"))
        newest = newest.select(*[F.col(_q(k)) for k in self.key_columns],
                               *[F.col("_eo_last").getField(c).alias(c) for c in carried])
        return newest.select(*[F.col(_q(c)) for c in rows],
                             F.lower(F.hex(F.col(POSITION_COLUMN))).alias(TABLE_POSITION_COLUMN),
                             F.col(DELETE_COLUMN), F.col(CHANGED_AT).alias(DELETED_AT))

    def unmarked(self, spark: SparkSession, newest: DataFrame) -> DataFrame:
        """:meth:`newest` without the creates and updates whose key's delete marker is as new or newer (older than
        the delete that removed its row). A delete always passes: the MERGE compares it with the row."""
        from pyspark.sql import functions as F

        self.create_markers(spark, newest)
        markers = spark.table(self.markers).select(*[F.col(_q(k)) for k in self.key_columns],
                                                   F.col(TABLE_POSITION_COLUMN).alias(_MARKER))
        kept = newest.join(markers, on=list(self.key_columns), how="left").where(
            F.col(DELETE_COLUMN) | F.col(_MARKER).isNull() | (F.col(TABLE_POSITION_COLUMN) > F.col(_MARKER)))
        return kept.select(*[F.col(_q(c)) for c in newest.columns])

    def create_markers(self, spark: SparkSession, newest: DataFrame) -> None:
        """The marker table, when missing (its own commit): the key columns, the position, the delete's time."""
        fields = {f.name: f.dataType.simpleString() for f in newest.schema.fields}
        columns = ", ".join(f"{_q(c)} {fields[c]}" for c in (*self.key_columns, TABLE_POSITION_COLUMN, DELETED_AT))
        spark.sql(f"CREATE TABLE IF NOT EXISTS {self.markers} ({columns}) USING {self.using}")

    def add_position_column(self, spark: SparkSession) -> None:
        """The target without :data:`TABLE_POSITION_COLUMN` (created with the source's columns only) gets it: its
        rows have no position yet, which every change is newer than."""
        if TABLE_POSITION_COLUMN in spark.sql(f"SELECT * FROM {self.target} LIMIT 0").columns:
            return
        spark.sql(f"ALTER TABLE {self.target} ADD COLUMNS ({_q(TABLE_POSITION_COLUMN)} STRING)")
        log.info("%s: added the column %s to %s: the position of the change that wrote each row", self.label,
                 TABLE_POSITION_COLUMN, self.target)

    def write_markers(self, spark: SparkSession, newest: DataFrame,
                      retried: Callable[[Callable[[], None]], None]) -> None:
        """The batch's deletes as markers (a commit of the marker table when there is one; ``retried`` runs it
        again after a conflict with another writer)."""
        from pyspark.sql import functions as F

        deletes = newest.where(F.col(DELETE_COLUMN)).select(*[F.col(_q(k)) for k in self.key_columns],
                                                           F.col(TABLE_POSITION_COLUMN), F.col(DELETED_AT))
        if deletes.isEmpty():
            return
        view = f"_eo_markers_{uuid.uuid4().hex}"
        on = " AND ".join(f"m.{_q(k)} = s.{_q(k)}" for k in self.key_columns)
        names = ", ".join(_q(c) for c in deletes.columns)
        values = ", ".join(f"s.{_q(c)}" for c in deletes.columns)
        position, at = _q(TABLE_POSITION_COLUMN), _q(DELETED_AT)
        statement = (f"MERGE INTO {self.markers} m USING {view} s ON {on} "
                     f"WHEN MATCHED AND s.{position} > m.{position} THEN UPDATE SET m.{position} = s.{position}, "
                     f"m.{at} = s.{at} WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})")

        def merge() -> None:
            spark.sql(statement).collect()

        deletes.createOrReplaceTempView(view)
        try:
            retried(merge)
        finally:
            spark.catalog.dropTempView(view)

    def purge_markers(self, spark: SparkSession, batch_id: int) -> None:
        """Every :data:`PURGE_EVERY` batches, the markers past retention go (a failure is logged: the next purge
        tries again)."""
        if batch_id % PURGE_EVERY:
            return
        cutoff = time.time() - DEFAULT_DELETE_RETENTION.total_seconds()
        try:
            spark.sql(f"DELETE FROM {self.markers} WHERE {_q(DELETED_AT)} < timestamp_seconds({int(cutoff)})")
        except Exception:
            log.warning("%s: could not remove delete markers past retention from %s (a later batch tries again)",
                        self.label, self.markers, exc_info=True)


def change_merge_statement(target: str, view: str, key_columns: Sequence[str], columns: Sequence[str]) -> str:
    """``MERGE`` of the newest changes (``view``: :meth:`ChangeTables.newest`) into ``target`` on the key: a change
    newer than the row's position (a row without one: older than every change) deletes it or replaces it with its
    position; a key without a row is inserted unless its change is a delete. ``columns``: the target's (the row's
    and :data:`TABLE_POSITION_COLUMN`)."""
    on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in key_columns)
    position, deleted = _q(TABLE_POSITION_COLUMN), _q(DELETE_COLUMN)
    newer = f"(t.{position} IS NULL OR s.{position} > t.{position})"
    sets = ", ".join(f"t.{_q(c)} = s.{_q(c)}" for c in columns if c not in key_columns)
    names, values = ", ".join(map(_q, columns)), ", ".join(f"s.{_q(c)}" for c in columns)
    return (f"MERGE INTO {target} t USING {view} s ON {on} "
            f"WHEN MATCHED AND s.{deleted} AND {newer} THEN DELETE "
            f"WHEN MATCHED AND NOT s.{deleted} AND {newer} THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED AND NOT s.{deleted} THEN INSERT ({names}) VALUES ({values})")
