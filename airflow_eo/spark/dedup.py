"""``dedup_key`` in Spark: a batch's copies of events already seen are marked where the records are, never on the
driver. Each good record gets its event id (``_eo_id``); the records are spread by id, so that each task holds every
record of its ids, asks the sink's seen-id table where those ids were seen (the sink's look-up, in chunks) and marks
each record with :func:`airflow_eo.core.dedup.keep`'s decision: ``_eo_dup`` (a copy: dropped) and ``_eo_new`` (the
id's first sighting: written to the seen-id table with the batch)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_eo.core.dedup import SeenAt, keep
from airflow_eo.core.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The columns this module adds to the parsed records.
ID, DUPLICATE, NEW = "_eo_id", "_eo_dup", "_eo_new"


def with_event_ids(parsed: DataFrame, key: Sequence[str]) -> DataFrame:
    """``parsed`` with ``_eo_id``: the hex of the first 128 bits of the SHA-256 of the key columns' JSON, for good
    records (NULL for bad ones, which are no event)."""
    from pyspark.sql import functions as F

    missing = [c for c in key if c not in parsed.columns]
    if missing:
        shown = [c for c in parsed.columns if not c.startswith("_eo_")]
        raise ConfigurationError(f"dedup_key names column(s) {', '.join(missing)} that the parsed records lack; "
                                 f"their columns are {', '.join(shown)}")
    identity = F.to_json(F.struct(*[F.col(f"`{c}`").alias(c) for c in key]))
    return parsed.withColumn(ID, F.when(F.col("_eo_error").isNull(), F.substring(F.sha2(identity, 256), 1, 32)))


def mark_duplicates(parsed: DataFrame, lookup: Callable[[Iterable[str]], Mapping[str, SeenAt]],
                    retention: timedelta, partitions: int) -> DataFrame:
    """The records (with ``_eo_id``) spread by id into ``partitions`` tasks, each marked ``_eo_dup`` / ``_eo_new``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StructField, StructType

    spread = parsed.repartition(partitions, F.col(ID))
    names = spread.columns
    # mapInArrow refers to its input's columns by name, which Spark parses (a backquote in one fails): positional
    # names in between, as the partition writers do.
    positional = spread.toDF(*(f"_eo_c{i}" for i in range(len(names))))
    schema = StructType([*positional.schema.fields, StructField(DUPLICATE, BooleanType(), False),
                         StructField(NEW, BooleanType(), False)])
    columns = {name: i for i, name in enumerate(names)}

    def marked(batches: Iterable[Any]) -> Iterator[Any]:
        yield from _marked(batches, columns, lookup, retention)

    return positional.mapInArrow(marked, schema).toDF(*names, DUPLICATE, NEW)


def _marked(batches: Iterable[Any], columns: Mapping[str, int], lookup: Callable[[Iterable[str]], Mapping[str, SeenAt]],
            retention: timedelta) -> Iterator[Any]:
    """One task's records (every record of its ids) with their marks."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return
    ids = table.column(columns[ID]).to_pylist()
    times = pc.cast(table.column(columns["kafka_timestamp"]), pa.int64()).to_pylist()  # microseconds
    topics = table.column(columns["kafka_topic"]).to_pylist()
    partitions = table.column(columns["kafka_partition"]).to_pylist()
    offsets = table.column(columns["kafka_offset"]).to_pylist()
    rows_of: dict[str, list[int]] = {}
    for row, event_id in enumerate(ids):
        if event_id is not None:
            rows_of.setdefault(event_id, []).append(row)
    stored = lookup(rows_of)
    duplicate = [False] * table.num_rows
    new = [False] * table.num_rows
    for event_id, rows in rows_of.items():
        seen = stored.get(event_id)
        if len(rows) == 1 and seen is None:  # most ids: one record, never seen
            new[rows[0]] = True
            continue
        sightings = [SeenAt((times[r] or 0) // 1000, topics[r], partitions[r], offsets[r]) for r in rows]
        kept, write = keep(sightings, seen, retention)
        for i, row in enumerate(rows):
            duplicate[row] = i != kept
        if kept is not None and write:
            new[rows[kept]] = True
    marks = table.append_column(DUPLICATE, pa.array(duplicate, pa.bool_()))
    yield from marks.append_column(NEW, pa.array(new, pa.bool_())).to_batches()


def seen_id_rows(marked: DataFrame, pipeline_id: str, batch_id: int) -> DataFrame:
    """The first sightings of the batch as rows of the seen-id table (:data:`~airflow_eo.core.dedup.SEEN_ID_FIELDS`)."""
    from pyspark.sql import functions as F

    return marked.where(F.col(NEW)).select(
        F.lit(pipeline_id).alias("pipeline_id"), F.col(ID).alias("event_id"), F.col("kafka_topic").alias("topic"),
        F.col("kafka_partition"), F.col("kafka_offset"),
        F.floor(F.unix_micros(F.col("kafka_timestamp")) / 1000).cast("long").alias("seen_at"),
        F.lit(batch_id).cast("long").alias("batch_id"))
