"""Change streams in Spark (``changes="debezium"``, :mod:`airflow_eo.core.changes`): a batch's Debezium change events
parsed into the source table's rows (the ``after`` image of a create, snapshot read or update; the key of ``before``
for a delete), each with its source position; per key, the newest change of the batch by position; of those, the
ones newer than the position the sink recorded for the key (its look-up, in chunks, where the records are).

Records that are no change of a row are skipped, not bad: the tombstone Debezium writes after a delete, and the
records of its heartbeat and transaction-metadata topics when a pipeline reads them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_eo.core.changes import (
    CHANGE_OP,
    DELETE_OP,
    ENVELOPE_FIELDS,
    POSITION_COLUMN,
    TRUNCATE_KEY,
    TRUNCATE_OP,
    UPSERT_OPS,
    newer,
)
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark.columns import computed_once, positional
from airflow_eo.spark.json_text import has_lone_surrogate_escape, lone_surrogate_error

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: The columns this module adds: a change that is no row (skipped), the key's id (16 bytes of a hash of the key
#: columns' values), and whether the change is its key's newest in the batch.
SKIP, KEY_ID, NEWEST = "_eo_skip", "_eo_key_id", "_eo_newest"
#: The parts of Debezium's ``source`` block that give a change's position (PostgreSQL, MySQL / MariaDB).
SOURCE_DDL = "lsn BIGINT, sequence STRING, file STRING, pos BIGINT, row INT, snapshot STRING"
_SOURCE_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (name, ddl) for name, ddl in (part.strip().split(" ", 1) for part in SOURCE_DDL.split(",")))
#: The fields of a JSON change event (:func:`envelope_ddl`), the converter's ``payload`` wrapper taken off.
_CHANGE_FIELDS = ("before", "after", "op", "source", "ts_ms", "status")
#: A change's op and position, computed once per record while it is parsed (:func:`change_columns`).
_OP, _POSITION = "_eo_change_op", "_eo_change_position"


def envelope_ddl(row: StructType) -> str:
    """The Spark DDL of a Debezium change event's JSON, with the JSON converter's ``schema``/``payload`` wrapper or
    without it (both parse: one shape's fields are NULL), and the fields of Debezium's heartbeat and transaction
    records that tell them apart."""
    image = f"STRUCT<{', '.join(f'`{f.name}`: {f.dataType.simpleString()}' for f in row.fields)}>"
    change = f"before {image}, after {image}, op STRING, source STRUCT<{_struct(SOURCE_DDL)}>, ts_ms BIGINT"
    return f"payload STRUCT<{_struct(change)}, status STRING>, {change}, status STRING"


def _struct(ddl: str) -> str:
    """``a T, b U`` as a STRUCT's field list ``a: T, b: U``."""
    fields = []
    depth, start = 0, 0
    for i, ch in enumerate(ddl):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            fields.append(ddl[start:i].strip())
            start = i + 1
    fields.append(ddl[start:].strip())
    return ", ".join(f"{f.split(' ', 1)[0]}: {f.split(' ', 1)[1]}" for f in fields)


def parse_changes(df: DataFrame, row: StructType, envelope: StructType, key_columns: Sequence[str],
                  truncates: bool = False) -> tuple[DataFrame, list[Column], Column, Column]:
    """``df``'s ``kafka_value`` parsed as change events (``envelope``: :func:`envelope_ddl` of ``row``): the
    frame, :func:`change_columns`, the error of each record (NULL: a good change, or a record skipped) and whether
    it is skipped."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([*envelope.fields, StructField("_eo_corrupt", StringType(), True)])
    text = F.col("kafka_value").cast("string")
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_eo_corrupt"}
    # Computed once per record: filters on the error below would otherwise inline the parse into every reference
    # (as spark/parsing.py's JSON values).
    df = computed_once(df, "_eo_v", F.from_json(text, schema, options))
    # One shape, whichever the converter wrote: the change itself, its fields read below each once per record (a
    # CASE per field read through a struct would copy the struct every time).
    parsed = F.col("_eo_v")
    bare = F.struct(*[parsed.getField(name).alias(name) for name in _CHANGE_FIELDS])
    df = computed_once(df, "_eo_e",
                       F.when(parsed.getField("payload").isNotNull(), parsed.getField("payload")).otherwise(bare))
    df, columns, change_error, skip = change_columns(df, "_eo_e", row, key_columns, truncates=truncates)
    error = (F.when(~F.is_valid_utf8(text), F.lit("value is not valid UTF-8"))
             .when(has_lone_surrogate_escape(text), F.lit(lone_surrogate_error("value")))
             .when(F.col("_eo_v").isNull() | F.col("_eo_v._eo_corrupt").isNotNull(), F.lit(
                 "value is malformed JSON, or a change event whose row does not match the schema (a column of "
                 "another type)"))
             .otherwise(change_error))
    return df, columns, F.when(~skip, error), skip


def envelope_row(envelope: StructType, declared: StructType | None, option: str) -> StructType:
    """The row's columns of change events decoded from Avro or Protobuf (``envelope``: the decoded value's struct,
    Debezium's envelope without the JSON converter's wrapper): ``declared`` (``schema=``) when given, each of its
    columns a field of ``after`` of the same type, else the fields of ``after``. ``option`` names the envelope's
    schema (``avro_schema`` / ``protobuf_message``) in errors."""
    from pyspark.sql.types import StringType, StructField, StructType

    fields = {f.name: f.dataType for f in envelope.fields}
    hint = (f"{option} must be Debezium's change event envelope (before, after, source, op, ts_ms, transaction), as "
            "its converter writes the table topic's values")
    missing = [name for name in ENVELOPE_FIELDS if name not in fields]
    if missing:
        raise ConfigurationError(f"changes='debezium': the envelope has no {', '.join(map(repr, missing))}; {hint}")
    if not isinstance(fields["op"], StringType):
        raise ConfigurationError(f"changes='debezium': the envelope's 'op' is {fields['op'].simpleString()}, not a "
                                 f"string; {hint}")
    after, before, source = fields["after"], fields["before"], fields["source"]
    if not isinstance(after, StructType) or not isinstance(before, StructType):
        raise ConfigurationError(f"changes='debezium': the envelope's 'before' and 'after' must be the row's "
                                 f"record; {hint}")
    if not isinstance(source, StructType) or not ("lsn" in source.fieldNames()
                                                  or {"file", "pos"} <= set(source.fieldNames())):
        raise ConfigurationError(f"changes='debezium': the envelope's 'source' has no position (PostgreSQL's 'lsn', "
                                 f"MySQL's 'file' and 'pos'); {hint}")
    if declared is None:
        return StructType([StructField(f.name, f.dataType, True) for f in after.fields])
    image = {f.name: f.dataType for f in after.fields}
    disagree = []
    for f in declared.fields:
        if f.name not in image:
            disagree.append(f"{f.name!r} is not a field of the envelope's 'after' ({', '.join(image)})")
        elif image[f.name] != f.dataType:
            disagree.append(f"{f.name!r} is {f.dataType.simpleString()} in schema but "
                            f"{image[f.name].simpleString()} in the envelope's 'after'")
    if disagree:
        raise ConfigurationError(f"changes='debezium': schema= and {option} disagree: {'; '.join(disagree)}. Declare "
                                 f"each column as the envelope's 'after' has it, or leave schema out (the columns "
                                 f"are then the fields of 'after')")
    return declared


def decoded_changes(df: DataFrame, decoded: str, decode_error: Column, row: StructType, envelope: StructType,
                    key_columns: Sequence[str], truncates: bool = False
                    ) -> tuple[DataFrame, list[Column], Column, Column]:
    """As :func:`parse_changes`, for change events decoded from Avro or Protobuf into the struct column ``decoded``
    (``envelope``: its type) with ``decode_error`` (NULL: decoded)."""
    from pyspark.sql import functions as F

    df, columns, change_error, skip = change_columns(df, decoded, row, key_columns, envelope, truncates)
    error = F.coalesce(decode_error, change_error)
    return df, columns, F.when(~skip, error), skip


def change_columns(df: DataFrame, parsed: str, row: StructType, key_columns: Sequence[str],
                   envelope: StructType | None = None, truncates: bool = False
                   ) -> tuple[DataFrame, list[Column], Column, Column]:
    """``df`` with the change's op and position computed once (:data:`_OP`, :data:`_POSITION`: each is read by
    several of the columns below, and Spark does not share an expression between the branches of a CASE); from the
    struct column ``parsed`` (a change event parsed with :func:`envelope_ddl`, or decoded from Avro or
    Protobuf: then ``envelope`` is its type, without the JSON converter's ``payload`` wrapper): the row's columns (the
    ``after`` image, or ``before`` for a delete) followed by :data:`DELETE_COLUMN`, :data:`CHANGE_OP` and
    :data:`POSITION_COLUMN`; what is wrong with a change that is one (NULL: nothing); and whether the record is no
    change of a row (a tombstone, a heartbeat, a transaction's boundary)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    present = set(_CHANGE_FIELDS if envelope is None else envelope.fieldNames())

    def part(name: str) -> Column:
        return F.col(parsed).getField(name) if name in present else F.lit(None)

    source = part("source")
    if envelope is None:  # JSON: envelope_ddl's source block
        op = part("op")
        in_source = {name for name, _ in _SOURCE_FIELDS}
    else:
        # Protobuf has no NULL for a proto3 string: an event without an op has "".
        op = F.when(part("op") != "", part("op"))
        kind = envelope["source"].dataType
        in_source = set(kind.fieldNames()) if isinstance(kind, StructType) else set()
    ddl = dict(_SOURCE_FIELDS)

    def source_field(name: str) -> Column:
        """A field of ``source`` as :data:`SOURCE_DDL` types it; NULL where the connector has no such field
        (PostgreSQL's has no ``file``, MySQL's no ``lsn``)."""
        field = source.getField(name) if name in in_source else F.lit(None)
        return field if envelope is None else field.cast(ddl[name])

    df = df.withColumn(_OP, op)
    op = F.col(_OP)
    df = df.withColumn(_POSITION, _position(op, source_field))
    position = F.col(_POSITION)
    before, after = part("before"), part("after")

    def image(name: str) -> Column:  # the row's column: of the after image, or of before for a delete
        return F.when(op == DELETE_OP, before.getField(name)).otherwise(after.getField(name))

    columns = [image(f.name).alias(f.name) for f in row.fields]
    # A truncate (no row) counts as a delete for the value checks: it has no column values to check.
    deleted = op.isin(DELETE_OP, TRUNCATE_OP).alias(DELETE_COLUMN)
    # No row: a tombstone (Debezium's after a delete, for log compaction), a heartbeat ({"ts_ms": ..}) or a
    # transaction's BEGIN / END record.
    skip = F.col("kafka_value").isNull() | (op.isNull() & (part("status").isNotNull() | (
        before.isNull() & after.isNull() & source.isNull() & part("ts_ms").isNotNull())))
    error = F.when(op.isNull(), F.lit("not a Debezium change event: no 'op' (is changes='debezium' the topic's "
                                      "format?)"))
    if truncates:  # on_truncate="truncate": a good change of no row (the engine empties the target once)
        error = error.when(op == TRUNCATE_OP, F.when(position.isNull(), F.lit(
            "a truncate without a source position (source.lsn or source.file/pos)")))
    else:
        error = error.when(op == TRUNCATE_OP, F.lit(
            "a truncate of the source table (op 't'): the target is not emptied; set on_truncate='truncate', or "
            "empty it and rewind the pipeline, or drop the event"))
    error = error.when(~op.isin(*UPSERT_OPS, DELETE_OP), F.concat(F.lit("unknown change op "), op))
    error = error.when(op.isin(*UPSERT_OPS) & after.isNull(), F.concat(F.lit("change op "), op,
                                                                      F.lit(" without its 'after' image")))
    error = error.when((op == DELETE_OP) & before.isNull(), F.lit(
        "delete without its 'before' image (the source table's replica identity must include the key)"))
    for key in key_columns:
        error = error.when(image(key).isNull(), F.lit(f"change without its key column {key!r}"))
    error = error.when(position.isNull(), F.lit("change without a source position (source.lsn or source.file/pos)"))
    return df, [*columns, deleted, op.alias(CHANGE_OP), position.alias(POSITION_COLUMN)], error, skip


def _position(op: Column, source: Callable[[str], Column]) -> Column:
    """The change's position (16 bytes, :func:`~airflow_eo.core.changes.postgres_position` /
    :func:`~airflow_eo.core.changes.mysql_position`) from the fields of its ``source`` block."""
    from pyspark.sql import functions as F

    # sequence: ["<last commit LSN>","<LSN>"] (either may be null). Split as text: a JSON parse per record costs
    # more than the rest of the position.
    sequence = source("sequence")

    def item(text: Column) -> Column:
        return F.translate(text, '[]" ', "").try_cast("long")

    pair = sequence.contains(",")
    snapshot = op == "r"
    lsn = F.coalesce(F.when(pair, item(F.substring_index(sequence, ",", -1))), source("lsn"))
    last_commit = F.when(pair, item(F.substring_index(sequence, ",", 1))).otherwise(item(sequence))
    pg_high = F.when(snapshot, lsn).otherwise(F.coalesce(last_commit, lsn))
    pg_low = F.when(snapshot, F.lit(0).cast("long")).otherwise(lsn)
    file_number = F.coalesce(F.regexp_extract(source("file"), r"\.(\d+)$", 1).try_cast("long"),
                             F.lit(0).cast("long"))
    my_low = F.shiftleft(source("pos"), 24).bitwiseOR(
        F.when(snapshot, F.lit(0)).otherwise(F.coalesce(source("row"), F.lit(0)) + 1).cast("long"))
    mysql = source("file").isNotNull() & source("pos").isNotNull()
    high = F.when(mysql, file_number).otherwise(pg_high)
    low = F.when(mysql, my_low).otherwise(pg_low)

    def hex16(value: Column) -> Column:
        return F.lpad(F.hex(value), 16, "0")

    return F.when(low.isNotNull(), F.unhex(F.concat(hex16(high), hex16(low))))


def with_key_ids(parsed: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """``parsed`` with :data:`KEY_ID`: the first 128 bits of the SHA-256 of the key columns' JSON, for every change
    whose key and position are known, a bad one included (the newest change of a key may be one the table refuses:
    then no older one is written in its place)."""
    from pyspark.sql import functions as F

    _check_key_columns(parsed, key_columns)
    identity = _key_json(parsed, key_columns)
    known = F.col(POSITION_COLUMN).isNotNull()
    for c in key_columns:
        known = known & F.col(f"`{c}`").isNotNull()
    return parsed.withColumn(KEY_ID, F.when(known, F.unhex(F.substring(F.sha2(identity, 256), 1, 32))))


def _check_key_columns(parsed: DataFrame, key_columns: Sequence[str]) -> None:
    missing = [c for c in key_columns if c not in parsed.columns]
    if missing:
        raise ConfigurationError(f"changes: the sink's key column(s) {', '.join(missing)} are not columns of the "
                                 f"schema ({', '.join(c for c in parsed.columns if not c.startswith('_eo_'))})")


def _key_json(parsed: DataFrame, key_columns: Sequence[str]) -> Column:
    """The key columns' values as ``to_json(struct(key columns))`` writes them (the key id hashes this text, so it
    must not change): spelled out with ``concat`` when every key column is an integer with a plain name (the common
    primary key; Jackson per record costs more), else ``to_json`` itself."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType

    types = {f.name: f.dataType for f in parsed.schema.fields}
    if not all(isinstance(types[c], (ByteType, ShortType, IntegerType, LongType)) and re.fullmatch(r"\w+", c, re.ASCII)
               for c in key_columns):
        return F.to_json(F.struct(*[F.col(f"`{c}`") for c in key_columns]))
    parts: list[Column] = []
    for i, c in enumerate(key_columns):
        parts += [F.lit(("{" if i == 0 else ",") + f'"{c}":'), F.col(f"`{c}`").cast("string")]
    return F.concat(*parts, F.lit("}"))


def newest_changes(parsed: DataFrame, key_columns: Sequence[str],
                   lookup: Callable[[Iterable[bytes]], Mapping[bytes, bytes]], partitions: int) -> DataFrame:
    """The batch's changes spread by key (``key_columns``) into ``partitions`` tasks; per key, the newest change by
    position when it is newer than the sink's recorded one (:func:`~airflow_eo.core.changes.winners`), with its
    :data:`KEY_ID`. Bad records stay (they become dead letters or fail the batch); every other change goes.

    The newest change of each key is found by Spark (a window over the key, as its sort needs no Python), so only
    those reach the look-up's Python tasks, and get a key id (a hash): a tenth of the records where a key changes
    ten times a batch."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StructField, StructType

    _check_key_columns(parsed, key_columns)
    keys = [F.col(f"`{c}`") for c in key_columns]
    spread = parsed.repartition(partitions, *keys)  # the window's exchange: the tasks are ours
    latest = Window.partitionBy(*keys).orderBy(F.col(POSITION_COLUMN).desc())
    ranked = spread.withColumn(NEWEST, F.row_number().over(latest) == 1)
    # A key's newest change, or any bad record (a bad newest change is kept as bad: no older one is written for it).
    candidates, names = positional(with_key_ids(
        ranked.where(F.col(NEWEST) | F.col("_eo_error").isNotNull()).drop(NEWEST), key_columns))
    schema = StructType([*candidates.schema.fields, StructField(NEWEST, BooleanType(), False)])
    key_at, position_at, error_at = names.index(KEY_ID), names.index(POSITION_COLUMN), names.index("_eo_error")

    def marked(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        received = list(batches)
        table = pa.Table.from_batches(received) if received else None
        if table is None or table.num_rows == 0:
            return
        marks = newest_marks(table, key_at, position_at, error_at, lookup)
        yield from table.append_column(NEWEST, marks).to_batches()

    marked_df = candidates.mapInArrow(marked, schema).toDF(*names, NEWEST)
    return marked_df.where(F.col(NEWEST) | F.col("_eo_error").isNotNull()).drop(NEWEST)


def newest_marks(table: Any, key_at: int, position_at: int, error_at: int,
                 lookup: Callable[[Iterable[bytes]], Mapping[bytes, bytes]]) -> Any:
    """One task's changes (an Arrow table holding, of each of its keys, every change or at least the newest one and the
    bad ones: :func:`newest_changes` hands it those): True for the change each key writes.
    The newest by position of each key is found with Arrow's sort; the recorded positions of those keys are read at
    once (the look-up), and a change not newer than its key's is not written, nor one that is a bad record (the
    key's older changes are not written in its place)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = table.column(key_at).combine_chunks()
    positions = table.column(position_at).combine_chunks()
    index = pa.array(range(len(keys)), pa.int64())
    valid = pc.is_valid(keys)
    bad = pc.is_valid(table.column(error_at).combine_chunks())
    candidates = pa.table({"k": keys, "p": positions, "i": index, "bad": bad}).filter(valid)
    # Descending by position within each key: the first row of each key is its newest change.
    ordered = candidates.sort_by([("k", "ascending"), ("p", "descending")])
    ordered_keys = ordered.column("k").to_pylist()
    firsts = [i for i, k in enumerate(ordered_keys) if i == 0 or k != ordered_keys[i - 1]]
    newest = ordered.take(pa.array(firsts, pa.int64()))
    # The pipeline's truncate floor (on_truncate="truncate") is read with the keys: no change older applies.
    applied = dict(lookup([*newest.column("k").to_pylist(), TRUNCATE_KEY]))
    floor = applied.pop(TRUNCATE_KEY, None)
    chosen = [int(i) for k, p, i, b in zip(newest.column("k").to_pylist(), newest.column("p").to_pylist(),
                                           newest.column("i").to_pylist(), newest.column("bad").to_pylist(),
                                           strict=True)
              if not b and newer(p, max(applied.get(k, b""), floor or b""))]
    marks = [False] * len(keys)
    for i in chosen:
        marks[i] = True
    return pa.array(marks, pa.bool_())


def truncate_position(parsed: DataFrame) -> bytes | None:
    """The position of the batch's newest truncate of the source table (``on_truncate="truncate"``); None: none."""
    from pyspark.sql import functions as F

    [row] = parsed.where((F.col(CHANGE_OP) == TRUNCATE_OP) & F.col("_eo_error").isNull() & ~F.col(SKIP)).agg(
        F.max(POSITION_COLUMN).alias("position")).collect()
    return None if row["position"] is None else bytes(row["position"])
