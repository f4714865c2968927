"""``dedup_key`` in Spark: a batch's copies of events already seen are marked where the records are, never on the
driver. Each good record gets its event id (``_eo_id``); the records are spread by id, so that each task holds every
record of its ids, asks the sink's seen-id table where those ids were seen (the sink's look-up, in chunks) and marks
each record with :func:`airflow_eo.core.dedup.keep`'s decision: ``_eo_dup`` (a copy: dropped) and ``_eo_new`` (the
id's first sighting: written to the seen-id table with the batch)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_eo.core.dedup import SeenAt, keep, seen_pipeline_key
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark.parsing import KEY_COLUMN, positional

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: The columns this module adds to the parsed records.
ID, DUPLICATE, NEW = "_eo_id", "_eo_dup", "_eo_new"


def with_event_ids(parsed: DataFrame, key: Sequence[str]) -> DataFrame:
    """``parsed`` with ``_eo_id``: the first 128 bits of the SHA-256 of the key columns' JSON (16 bytes), for good
    records (NULL for bad ones, which are no event). A column is a parsed column (``key``: the record's whole key)
    or ``key.<field>``, one field of a struct key."""
    from pyspark.sql import functions as F

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
    return parsed.withColumn(ID, F.when(F.col("_eo_error").isNull(),
                                        F.unhex(F.substring(F.sha2(identity, 256), 1, 32))))


def mark_duplicates(parsed: DataFrame, lookup: Callable[[Iterable[bytes]], Mapping[bytes, SeenAt]],
                    retention: timedelta, partitions: int) -> DataFrame:
    """The records (with ``_eo_id``) spread by id into ``partitions`` tasks, each marked ``_eo_dup`` / ``_eo_new``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StructField, StructType

    spread, names = positional(parsed.repartition(partitions, F.col(ID)))
    schema = StructType([*spread.schema.fields, StructField(DUPLICATE, BooleanType(), False),
                         StructField(NEW, BooleanType(), False)])
    columns = {name: i for i, name in enumerate(names)}

    def marked(batches: Iterable[Any]) -> Iterator[Any]:
        yield from _marked(batches, columns, lookup, retention)

    return spread.mapInArrow(marked, schema).toDF(*names, DUPLICATE, NEW)


def _marked(batches: Iterable[Any], columns: Mapping[str, int],
            lookup: Callable[[Iterable[bytes]], Mapping[bytes, SeenAt]], retention: timedelta) -> Iterator[Any]:
    """One task's records (every record of its ids) with their marks. Most ids are one record never seen before:
    those are marked with Arrow's compute functions; only the records of ids seen twice in the batch or found in the
    table are decided one by one (:func:`~airflow_eo.core.dedup.keep`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    received = list(batches)  # none at all for a task whose partition is empty (few ids, or an empty batch)
    table = pa.Table.from_batches(received) if received else None
    if table is None or table.num_rows == 0:
        return
    ids = table.column(columns[ID]).combine_chunks()
    valid = pc.is_valid(ids)
    counted = pc.value_counts(ids.filter(valid))
    stored = lookup(counted.field("values").to_pylist())
    repeated = counted.field("values").filter(pc.greater(counted.field("counts"), 1))
    special = pa.array([*repeated.to_pylist(), *stored], ids.type)
    one_by_one = pc.fill_null(pc.is_in(ids, value_set=special), False)
    new = pc.and_(valid, pc.invert(one_by_one)).to_pylist()  # a single record of an id never seen: the event
    duplicate = [False] * table.num_rows
    rows = pc.indices_nonzero(one_by_one).to_pylist()
    if rows:
        picked = table.take(pa.array(rows, pa.int64()))
        times = pc.cast(picked.column(columns["kafka_timestamp"]), pa.int64()).to_pylist()  # microseconds
        topics = picked.column(columns["kafka_topic"]).to_pylist()
        partitions = picked.column(columns["kafka_partition"]).to_pylist()
        offsets = picked.column(columns["kafka_offset"]).to_pylist()
        rows_of: dict[bytes, list[int]] = {}
        for i, event_id in enumerate(picked.column(columns[ID]).to_pylist()):
            rows_of.setdefault(event_id, []).append(i)
        for event_id, group in rows_of.items():
            sightings = [SeenAt((times[i] or 0) // 1000, topics[i], partitions[i], offsets[i]) for i in group]
            kept, write = keep(sightings, stored.get(event_id), retention)
            for n, i in enumerate(group):
                duplicate[rows[i]] = n != kept
                new[rows[i]] = n == kept and write
    marks = table.append_column(DUPLICATE, pa.array(duplicate, pa.bool_()))
    yield from marks.append_column(NEW, pa.array(new, pa.bool_())).to_batches()


def seen_id_rows(marked: DataFrame, pipeline_id: str, batch_id: int) -> DataFrame:
    """The first sightings of the batch as rows of the seen-id table (:data:`~airflow_eo.core.dedup.SEEN_ID_FIELDS`)."""
    from pyspark.sql import functions as F

    return marked.where(F.col(NEW)).select(
        F.lit(bytearray(seen_pipeline_key(pipeline_id))).alias("pipeline_key"), F.col(ID).alias("event_id"),
        F.col("kafka_topic").alias("topic"),
        F.col("kafka_partition"), F.col("kafka_offset"),
        F.floor(F.unix_micros(F.col("kafka_timestamp")) / 1000).cast("long").alias("seen_at"),
        F.lit(batch_id).cast("long").alias("batch_id"))
