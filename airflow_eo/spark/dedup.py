"""``dedup_key`` in Spark: a batch's copies of events already seen are marked where the records are, never on the
driver. Each good record gets its event id (``_eo_id``); the records are spread by id, so that each task holds every
record of its ids, asks the sink's seen-id table where those ids were seen (the sink's look-up, in chunks) and marks
each record with :func:`airflow_eo.core.dedup.keep`'s decision: ``_eo_dup`` (a copy: dropped) and ``_eo_new`` (the
id's first sighting: written to the seen-id table with the batch). The seen-id table's writes are here too: its writer
run as a job's partition writer (:class:`SeenIdPartitions`) and the purge of ids past retention
(:func:`purge_seen_ids`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_eo.core.abilities import SeenIds
from airflow_eo.core.batch import PartitionWriter, TaskDedup
from airflow_eo.core.dedup import (
    PURGE_LIMIT,
    SEEN_ID_KEY,
    SeenAt,
    keep,
    purge_cutoff,
    purge_until_caught_up,
    retention_ms,
    seen_id_partition,
    seen_pipeline_key,
    sighting_ms,
)
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark.columns import positional
from airflow_eo.spark.parsing import KEY_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)
#: The columns this module adds to the parsed records.
ID, DUPLICATE, NEW = "_eo_id", "_eo_dup", "_eo_new"


def with_event_ids(parsed: DataFrame, key: Sequence[str]) -> DataFrame:
    """``parsed`` with ``_eo_id``: the first 128 bits of the SHA-256 of the key columns' JSON (16 bytes), for good
    records. A column is a parsed column (``key``: the record's whole key) or ``key.<field>``, one field of a struct
    key. NULL (no event id: never a copy, never remembered, always written) for a bad record and for a good one
    whose key columns are all NULL (a struct: NULL or every field NULL): such a record names no event, and all of
    them would otherwise share the id of ``{}`` and be dropped as copies of the first."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DataType, StructType

    fields = {f.name: f.dataType for f in parsed.schema.fields}
    key_fields = getattr(fields.get(KEY_COLUMN), "names", None) or []  # a struct key (key_format json, avro ..)

    def column(name: str) -> Column | None:
        if name in fields:
            return F.col(f"`{name}`")
        head, dot, field = name.partition(".")
        if dot and head == KEY_COLUMN and field in key_fields:  # one field of the record's key
            return F.col(KEY_COLUMN).getField(field)
        return None

    columns = {c: column(c) for c in key}
    missing = [c for c, found in columns.items() if found is None]
    if missing:
        shown = [c for c in parsed.columns if not c.startswith("_eo_")] + [f"{KEY_COLUMN}.{f}" for f in key_fields]
        raise ConfigurationError(f"dedup_key names column(s) {', '.join(missing)} that the parsed records lack; "
                                 f"their columns are {', '.join(shown)}")
    identity = F.to_json(F.struct(*[found.alias(c) for c, found in columns.items() if found is not None]))
    types = {c: parsed.select(found).schema.fields[0].dataType for c, found in columns.items() if found is not None}

    def absent(value: Column, data_type: DataType) -> Column:  # what to_json leaves out: NULL, or a struct of those
        if isinstance(data_type, StructType):
            return value.isNull() | _all([absent(value.getField(f.name), f.dataType) for f in data_type.fields])
        return value.isNull()

    no_identity = _all([absent(found, types[c]) for c, found in columns.items() if found is not None])
    return parsed.withColumn(ID, F.when(F.col("_eo_error").isNull() & ~no_identity,
                                        F.unhex(F.substring(F.sha2(identity, 256), 1, 32))))


def _all(conditions: Sequence[Column]) -> Column:
    """Every one of ``conditions`` (true for none)."""
    from functools import reduce

    from pyspark.sql import functions as F

    return reduce(lambda a, b: a & b, conditions) if conditions else F.lit(True)


#: Where a record is, for the write tasks that mark copies themselves (:func:`position_columns`): the metadata
#: columns under names of their own, so that no output column is taken for them.
AT_TOPIC, AT_PARTITION, AT_OFFSET, AT_TIMESTAMP = "_eo_at_topic", "_eo_at_partition", "_eo_at_offset", "_eo_at_ts"
#: The columns :func:`duplicate_marks` reads: the id and where the record is.
MARKED_BY = {ID: ID, "kafka_timestamp": AT_TIMESTAMP, "kafka_topic": AT_TOPIC, "kafka_partition": AT_PARTITION,
             "kafka_offset": AT_OFFSET}


def mark_duplicates(parsed: DataFrame, lookup: Callable[[Iterable[bytes]], Mapping[bytes, SeenAt]],
                    retention: timedelta, partitions: int, now_ms: int | None = None) -> DataFrame:
    """The records (with ``_eo_id``) spread by id into ``partitions`` tasks, each marked ``_eo_dup`` / ``_eo_new``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StructField, StructType

    spread, names = positional(parsed.repartition(partitions, F.col(ID)))
    schema = StructType([*spread.schema.fields, StructField(DUPLICATE, BooleanType(), False),
                         StructField(NEW, BooleanType(), False)])
    columns = {role: names.index(role) for role in MARKED_BY}

    def marked(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        received = list(batches)  # none at all for a task whose partition is empty (few ids, or an empty batch)
        table = pa.Table.from_batches(received) if received else None
        if table is None or table.num_rows == 0:
            return
        duplicate, new = duplicate_marks(table, columns, lookup, retention, now_ms)
        yield from table.append_column(DUPLICATE, duplicate).append_column(NEW, new).to_batches()

    return spread.mapInArrow(marked, schema).toDF(*names, DUPLICATE, NEW)


def position_columns() -> list[Column]:
    """What a write task that marks copies needs besides the output's columns: ``_eo_id`` and where the record is
    (:data:`MARKED_BY`)."""
    from pyspark.sql import functions as F

    return [F.col(ID), *[F.col(source).alias(alias) for source, alias in MARKED_BY.items() if source != ID]]


def duplicate_marks(table: Any, columns: Mapping[str, int], lookup: Callable[[Iterable[bytes]], Mapping[bytes, SeenAt]],
                    retention: timedelta, now_ms: int | None = None) -> tuple[Any, Any]:
    """One task's records (an Arrow table holding every record of its ids; ``columns``: the index of each of
    :data:`MARKED_BY`'s roles) marked: (copies, first sightings), two boolean arrays. Most ids are one record never
    seen before: those are marked with Arrow's compute functions; only the records of ids seen twice in the batch or
    found in the table are decided one by one (:func:`~airflow_eo.core.dedup.keep`). A bad record (no id) is
    neither. No time, the records' nor the table's, is later than ``now_ms`` (the batch's wall clock:
    :func:`~airflow_eo.core.dedup.sighting_ms`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = table.column(columns[ID]).combine_chunks()
    valid = pc.is_valid(ids)
    counted = pc.value_counts(ids.filter(valid))
    stored = lookup(counted.field("values").to_pylist())
    repeated = counted.field("values").filter(pc.greater(counted.field("counts"), 1))
    special = pa.array([*repeated.to_pylist(), *stored], ids.type)
    one_by_one = pc.fill_null(pc.is_in(ids, value_set=special), False)
    new = pc.and_(valid, pc.invert(one_by_one))  # a single record of an id never seen: the event
    rows = pc.indices_nonzero(one_by_one).to_pylist()
    if not rows:  # no id of the task seen twice nor stored: no copy at all
        return pc.and_(new, pa.scalar(False)), new
    new_list = new.to_pylist()
    duplicate = [False] * table.num_rows
    picked = table.take(pa.array(rows, pa.int64()))
    times = pc.cast(picked.column(columns["kafka_timestamp"]), pa.int64()).to_pylist()  # microseconds
    topics = picked.column(columns["kafka_topic"]).to_pylist()
    partitions = picked.column(columns["kafka_partition"]).to_pylist()
    offsets = picked.column(columns["kafka_offset"]).to_pylist()
    rows_of: dict[bytes, list[int]] = {}
    for i, event_id in enumerate(picked.column(columns[ID]).to_pylist()):
        rows_of.setdefault(event_id, []).append(i)
    for event_id, group in rows_of.items():
        sightings = [SeenAt(sighting_ms((times[i] or 0) // 1000, now_ms, retention), topics[i], partitions[i],
                            offsets[i])
                     for i in group]
        seen = stored.get(event_id)
        if seen is not None and now_ms is not None and seen.timestamp_ms > now_ms:
            seen = None  # a future date (written before sighting_ms): no evidence of a copy; the id is seen anew
        kept, write = keep(sightings, seen, retention)
        for n, i in enumerate(group):
            duplicate[rows[i]] = n != kept
            new_list[rows[i]] = n == kept and write
    return pa.array(duplicate, pa.bool_()), pa.array(new_list, pa.bool_())


def seen_id_table(table: Any, columns: Mapping[str, int], new: Any, pipeline_id: str, batch_id: int,
                  now_ms: int | None = None, retention: timedelta | None = None) -> Any:
    """The first sightings among one task's marked records (``new``) as an Arrow table of the seen-id table's rows
    (:data:`~airflow_eo.core.dedup.SEEN_ID_FIELDS`), for a write task that marks copies itself."""
    import pyarrow as pa
    import pyarrow.compute as pc

    firsts = table.filter(new)
    count = firsts.num_rows
    millis = pc.divide(pc.cast(firsts.column(columns["kafka_timestamp"]), pa.int64()), 1000)
    if now_ms is not None:  # within the batch's retention window (sighting_ms)
        millis = pc.min_element_wise(millis, pa.scalar(now_ms, pa.int64()))
        if retention is not None:
            millis = pc.max_element_wise(millis, pa.scalar(now_ms - retention_ms(retention), pa.int64()))
    return pa.table({
        "pipeline_key": pa.array([seen_pipeline_key(pipeline_id)] * count, pa.binary()),
        "event_id": firsts.column(columns[ID]),
        "topic": firsts.column(columns["kafka_topic"]),
        "kafka_partition": firsts.column(columns["kafka_partition"]),
        "kafka_offset": firsts.column(columns["kafka_offset"]),
        "seen_at": pc.cast(millis, pa.int64()),
        "batch_id": pa.array([batch_id] * count, pa.int64()),
    })


class TaskCopies:
    """One write task's marking of copies (:class:`~airflow_eo.core.batch.TaskDedup`): its whole partition is read
    (every record of its ids), marked (:func:`duplicate_marks`), and handed on without the
    copies; the ids it saw first are kept for the seen-id table. Runs in the Spark task."""

    def __init__(self) -> None:
        self.duplicates = 0
        self.oldest_ms: int | None = None
        self.first_sightings: Any = None

    def mark(self, batches: Iterable[Any], columns: Mapping[str, int], dedup: TaskDedup) -> list[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        received = list(batches)
        if not received:
            return []
        table = pa.Table.from_batches(received)
        if table.num_rows == 0:
            return []
        duplicate, new = duplicate_marks(table, columns, dedup.lookup, dedup.retention, dedup.now_ms)
        self.duplicates = int(pc.sum(duplicate).as_py() or 0)
        self.first_sightings = seen_id_table(table, columns, new, dedup.pipeline_id, dedup.batch_id, dedup.now_ms,
                                             dedup.retention)
        events = pc.is_valid(table.column(columns[ID]))
        oldest = pc.min(pc.cast(table.column(columns["kafka_timestamp"]).filter(events), pa.int64())).as_py()
        self.oldest_ms = None if oldest is None else sighting_ms(oldest // 1000, dedup.now_ms, dedup.retention)
        return table.filter(pc.invert(duplicate)).to_batches() if self.duplicates else table.to_batches()


def seen_id_rows(marked: DataFrame, pipeline_id: str, batch_id: int, now_ms: int | None = None,
                 retention: timedelta | None = None) -> DataFrame:
    """The first sightings of the batch as rows of the seen-id table (:data:`~airflow_eo.core.dedup.SEEN_ID_FIELDS`)."""
    from pyspark.sql import functions as F

    return marked.where(F.col(NEW)).select(
        F.lit(bytearray(seen_pipeline_key(pipeline_id))).alias("pipeline_key"), F.col(ID).alias("event_id"),
        F.col("kafka_topic").alias("topic"),
        F.col("kafka_partition"), F.col("kafka_offset"),
        _within(F.floor(F.unix_micros(F.col("kafka_timestamp")) / 1000).cast("long"), now_ms, retention)
        .alias("seen_at"),
        F.lit(batch_id).cast("long").alias("batch_id"))


def _within(millis: Column, now_ms: int | None, retention: timedelta | None) -> Column:
    """``millis`` within the batch's retention window (:func:`~airflow_eo.core.dedup.sighting_ms`)."""
    from pyspark.sql import functions as F

    if now_ms is None:
        return millis
    at_most = F.least(millis, F.lit(now_ms).cast("long"))
    return at_most if retention is None else F.greatest(at_most, F.lit(now_ms - retention_ms(retention)).cast("long"))


@dataclass(frozen=True)
class SeenIdPartitions:
    """The seen-id table's writer run as a job's partition writer, numbered as seen-id writers are
    (:func:`~airflow_eo.core.dedup.seen_id_partition`): its branches never take the place of the good rows' or the
    dead letters' of the same partition numbers."""

    writer: PartitionWriter

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(SEEN_ID_KEY)

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        import pyarrow as pa

        # In key order: the table's index takes them page after page instead of all over (ids are hashes).
        # Measured at 1,000,000 ids: 8.6 s unsorted.
        received = list(batches)
        ordered = pa.Table.from_batches(received).sort_by("event_id").to_batches() if received else []
        return self.writer(ordered, seen_id_partition(partition), stage_id, attempt_id, agreed)


def purge_seen_ids(seen: SeenIds, pipeline_id: str, oldest_ms: int | None, retention: timedelta) -> None:
    """Remove the ids past retention, older than the batch's oldest record by more than it, until caught up."""
    if oldest_ms is None:
        return
    cutoff = purge_cutoff(oldest_ms, retention)
    try:  # its own transactions: a purge that waits on another pipeline's locks costs this batch nothing else
        purged = purge_until_caught_up(lambda limit: seen.purge_seen_ids(pipeline_id, cutoff, limit), PURGE_LIMIT)
        if purged:
            log.info("dedup: %s event ids past retention removed", purged)
    except Exception:
        log.warning("dedup: could not remove event ids past retention (the next batch tries again)", exc_info=True)
