"""Records to rows on Spark: a batch's Kafka keys and values parsed by their formats, bad records marked, not dropped.

Every value format is parsed here (string, bytes, JSON with a Spark DDL schema, Avro through ``spark/avro.py``,
Protobuf through ``spark/protobuf.py``), and the key by ``key_format`` (string, JSON, Avro or Protobuf, the same
decoders) into the ``key`` column; the row keeps its Kafka metadata (:data:`METADATA_COLUMNS`), the raw
value, and an ``_eo_error`` column that is NULL for a good record and says what is wrong with a bad one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_eo.core.changes import TruncatePolicy
from airflow_eo.core.config import DELETE_COLUMN, Framing, KeyFormat, ParseConfig, ValueFormat
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark.avro import SchemaLookups, decode_avro
from airflow_eo.spark.changes import SKIP, decoded_changes, envelope_ddl, envelope_row, parse_changes
from airflow_eo.spark.columns import computed_once
from airflow_eo.spark.json_text import has_lone_surrogate_escape, lone_surrogate_error, may_open_json_document
from airflow_eo.spark.protobuf import decode_protobuf, load_descriptor_set

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: What the transform sees of each record besides its parsed value: topic, partition, offset, timestamp (Kafka's,
#: a TIMESTAMP), the raw key (BINARY) and the headers (ARRAY<STRUCT<key: STRING, value: BINARY>>).
METADATA_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key", "kafka_headers")
#: The parsed key (``key_format`` other than ``bytes``): a STRING, or a STRUCT of the key schema's fields.
KEY_COLUMN = "key"
def metadata_columns(parse: ParseConfig) -> tuple[str, ...]:
    """The columns a transform gets besides the payload's (dropped when there is no transform)."""
    return METADATA_COLUMNS + ((KEY_COLUMN,) if parse.key_format is not KeyFormat.BYTES else ())


def parse_records(spark: SparkSession, raw: DataFrame, parse: ParseConfig,
                  schema_lookup: Callable[[int], str | None] | None = None) -> tuple[DataFrame, list[str]]:
    """Parsed columns + metadata + ``_eo_error`` (NULL for good records); returns payload column names.

    :param schema_lookup: writer schemas of Confluent-framed Avro by id, asked for ids ``parse.writer_schemas`` lacks
        (each at most once in the batch: :class:`~airflow_eo.spark.avro.SchemaLookups`).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    df = raw
    framing = parse.framing or Framing.NONE
    lookups = SchemaLookups(schema_lookup) if schema_lookup is not None else None  # this batch's, keys and values
    change_columns: list[Column] = []  # changes=: the op, the position, and whether the record is no row
    if parse.changes is not None and parse.value_format is ValueFormat.JSON:
        row = _parse_ddl(spark, parse.schema or "")
        df, columns, value_error, skip = parse_changes(df, row, _parse_ddl(spark, envelope_ddl(row)),
                                                       parse.change_keys,
                                                       parse.on_truncate is TruncatePolicy.TRUNCATE)
        value_columns, change_columns = columns[:-2], [*columns[-2:], skip.alias(SKIP)]
        payload = [*(f.name for f in row.fields), DELETE_COLUMN]
    elif parse.changes is not None:  # Avro / Protobuf: Debezium's envelope decoded as any value, then read as JSON's
        if parse.value_format is ValueFormat.AVRO:
            option = "avro_schema"
            df, _, decode_error = decode_avro(spark, df, "kafka_value", parse.avro_schema or "", framing,
                                              parse.writer_schema_map, lookups, "_eo_v", "value")
        else:
            option = "protobuf_message"
            descriptors = load_descriptor_set(parse.protobuf_descriptor or "")
            df, _, decode_error = decode_protobuf(df, "kafka_value", descriptors, parse.protobuf_message or "",
                                                  framing, "_eo_v", "value")
        envelope = df.schema["_eo_v"].dataType
        if not isinstance(envelope, StructType):  # decoders make a struct of a record's / message's fields
            raise ConfigurationError(f"changes='debezium': {option} is not a record of fields")
        row = envelope_row(envelope, _parse_ddl(spark, parse.schema) if parse.schema else None, option)
        df, columns, value_error, skip = decoded_changes(df, "_eo_v", decode_error, row, envelope, parse.change_keys,
                                                         parse.on_truncate is TruncatePolicy.TRUNCATE)
        value_columns, change_columns = columns[:-2], [*columns[-2:], skip.alias(SKIP)]
        payload = [*(f.name for f in row.fields), DELETE_COLUMN]
    elif parse.value_format is ValueFormat.JSON:
        df, payload, value_error = _parse_json(df, "kafka_value", _parse_ddl(spark, parse.schema or ""), "_eo_v",
                                               "value")
        value_columns = [F.col("_eo_v").getField(n).alias(n) for n in payload]
    elif parse.value_format is ValueFormat.AVRO:
        df, payload, decode_error = decode_avro(spark, df, "kafka_value", parse.avro_schema or "", framing,
                                                parse.writer_schema_map, lookups, "_eo_v", "value")
        value_error = F.when(F.col("kafka_value").isNull(), F.lit("value is null")).otherwise(decode_error)
        value_columns = [F.col("_eo_v").getField(n).alias(n) for n in payload]
    elif parse.value_format is ValueFormat.PROTOBUF:
        descriptors = load_descriptor_set(parse.protobuf_descriptor or "")
        df, payload, decode_error = decode_protobuf(df, "kafka_value", descriptors, parse.protobuf_message or "",
                                                    framing, "_eo_v", "value")
        value_error = F.when(F.col("kafka_value").isNull(), F.lit("value is null")).otherwise(decode_error)
        value_columns = [F.col("_eo_v").getField(n).alias(n) for n in payload]
    else:
        value = F.col("kafka_value")
        if parse.value_format is ValueFormat.STRING:
            value = value.cast("string")
        value_error = F.when(F.col("kafka_value").isNull(), F.lit("value is null"))
        if parse.value_format is ValueFormat.STRING:
            value_error = value_error.when(~F.is_valid_utf8(value), F.lit("value is not valid UTF-8"))
        payload, value_columns = ["value"], [value.alias("value")]

    key = F.col("kafka_key")
    key_columns: list[Column] = []
    key_error: Column | None = None
    key_fields: dict[str, Column] = {}  # the key's value(s) by name, for tombstones that delete
    if parse.key_format is KeyFormat.STRING:
        key_columns = [key.cast("string").alias(KEY_COLUMN)]
        key_error = F.when(~F.is_valid_utf8(key.cast("string")), F.lit("key is not valid UTF-8"))
        key_fields = {name: key.cast("string") for name in parse.delete_keys[:1]}
    elif parse.key_format in (KeyFormat.JSON, KeyFormat.AVRO, KeyFormat.PROTOBUF):
        if parse.key_format is KeyFormat.JSON:
            df, fields, key_error = _parse_json(df, "kafka_key", _parse_ddl(spark, parse.key_schema or ""), "_eo_k",
                                                "key")
        elif parse.key_format is KeyFormat.AVRO:
            df, fields, key_error = decode_avro(spark, df, "kafka_key", parse.key_schema or "", framing,
                                                parse.writer_schema_map, lookups, "_eo_k", "key")
        else:  # the same executor-side decoder as Protobuf values, in a pass of its own over the key column
            descriptors = load_descriptor_set(parse.protobuf_descriptor or "")
            df, fields, key_error = decode_protobuf(df, "kafka_key", descriptors, parse.key_protobuf_message or "",
                                                    framing, "_eo_k", "key")
        # A record without a key has a NULL key column, not an error: keys are optional in Kafka.
        key_columns = [F.when(key.isNotNull(), F.struct(*[F.col("_eo_k").getField(n).alias(n) for n in fields]))
                       .alias(KEY_COLUMN)]
        key_error = F.when(key.isNotNull(), key_error)
        key_fields = {n: F.col("_eo_k").getField(n) for n in fields}
    clash = sorted(set(payload) & set(metadata_columns(parse)))
    if clash:
        raise ConfigurationError(f"value field(s) {clash} clash with the metadata columns {metadata_columns(parse)}: "
                                 "rename them in the schema")
    if parse.delete_keys:
        df, value_columns, value_error = _tombstones_as_deletes(df, parse, payload, value_columns, value_error,
                                                                key_fields)
        payload = [*payload, DELETE_COLUMN]
    error = value_error if key_error is None else F.coalesce(value_error, key_error)
    return df.select(*value_columns, *METADATA_COLUMNS, *key_columns, "kafka_value", error.alias("_eo_error"),
                     *change_columns), payload


def _tombstones_as_deletes(df: DataFrame, parse: ParseConfig, payload: list[str], value_columns: list[Column],
                           value_error: Column, key_fields: dict[str, Column]
                           ) -> tuple[DataFrame, list[Column], Column]:
    """``on_tombstone="delete"``: a record with a null value becomes a row whose key columns come from its Kafka key
    (cast to the value's types), its other columns NULL, and :data:`DELETE_COLUMN` True; one without a key (or
    without one of the key's fields) is a bad record saying so."""
    from pyspark.sql import functions as F

    absent = [k for k in parse.delete_keys if k not in payload]
    if absent:
        raise ConfigurationError(f"on_tombstone='delete': the sink's key column(s) {absent} are not fields of the "
                                 f"value ({payload}): an upsert names its row by them")
    unnamed = [k for k in parse.delete_keys if k not in key_fields]
    if unnamed:
        raise ConfigurationError(f"on_tombstone='delete': the sink's key column(s) {unnamed} are not fields of the "
                                 f"key schema ({sorted(key_fields)}): a tombstone names its row by them")
    types = {f.name: f.dataType for f in df.select(*value_columns).schema.fields}
    tombstone = F.col("kafka_value").isNull()
    columns = [F.when(tombstone, key_fields[name].cast(types[name])).otherwise(column).alias(name)
               if name in parse.delete_keys else column
               for name, column in zip(payload, value_columns, strict=True)]
    # The key's own parse errors (malformed JSON, ..) follow as for any record; these are the tombstone's.
    tombstone_error = F.when(F.col("kafka_key").isNull(), F.lit(
        "tombstone without a key: on_tombstone='delete' needs the Kafka key to name the deleted row"))
    for name in parse.delete_keys:
        tombstone_error = tombstone_error.when(key_fields[name].isNull(), F.lit(
            f"tombstone whose key has no {name!r}: on_tombstone='delete' needs every key column"))
    error = F.when(tombstone, tombstone_error).otherwise(value_error)
    return df, [*columns, tombstone.alias(DELETE_COLUMN)], error


def _parse_json(df: DataFrame, column: str, declared: StructType, tag: str, what: str
                ) -> tuple[DataFrame, list[str], Column]:
    """``df`` with ``column`` parsed as JSON into the struct column ``tag``; the field names and the error
    expression (NULL when good; a NULL ``column`` is the caller's to judge)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    required = [f.name for f in declared.fields if not f.nullable]
    parse_schema = StructType([StructField(f.name, f.dataType, True) for f in declared.fields]
                              + [StructField("_eo_corrupt", StringType(), True)])
    as_text = StructType([StructField(f.name, StringType(), True) for f in declared.fields]
                         + [StructField("_eo_corrupt", StringType(), True)])
    text = F.col(column).cast("string")
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_eo_corrupt"}
    prefix = "" if what == "value" else f"{what}: "
    as_text_col = f"{tag}_text"
    # Text that cannot hold a JSON object or array is malformed JSON without a parse: parsing it threw twice per
    # record (measured: 1,000,000 text lines read and parsed in 11.5 s, as many page views in 6.3 s).
    may_open = may_open_json_document(text)
    df = df.withColumn(tag, F.when(may_open, F.from_json(text, parse_schema, options)))
    typed_row_failed = F.col(tag).isNull() | F.col(f"{tag}._eo_corrupt").isNotNull()
    # Only a value whose typed parse failed is parsed again, with every field as STRING: that tells malformed
    # JSON apart from a field of the wrong type (Spark nulls the whole typed row in both cases). Good records
    # are parsed once.
    # Each parse is computed once per record: a filter on the error below would otherwise inline from_json into
    # every reference (measured: each value parsed ~20 times). One barrier above both parses does it: the second
    # reads the typed parse more than once, so Spark's CollapseProject keeps that in a projection of its own (it
    # inlines an expression that is not cheap into one reference only, unless a user sets
    # spark.sql.optimizer.collapseProjectAlwaysInline). A barrier per parse cost more (1M page views read and
    # parsed: 2.34 s against 2.25 s, medians of five rounds alternating).
    df = computed_once(df, as_text_col, F.when(typed_row_failed & may_open, F.from_json(text, as_text, options)))
    # A cast keeps a value's bytes as they are: invalid UTF-8 would reach the sink as mojibake.
    error = F.when(~F.is_valid_utf8(text), F.lit(f"{what} is not valid UTF-8")).when(
        has_lone_surrogate_escape(text), F.lit(lone_surrogate_error(what))).when(
        typed_row_failed & (F.col(as_text_col).isNull() | F.col(f"{as_text_col}._eo_corrupt").isNotNull()),
        F.lit(f"{prefix}malformed JSON"))
    for f in declared.fields:
        typed = F.col(tag).getField(f.name)
        if not isinstance(f.dataType, StringType):
            typed = F.when(typed_row_failed, F.col(as_text_col).getField(f.name).try_cast(f.dataType)).otherwise(typed)
        error = error.when(typed.isNull() & F.col(as_text_col).getField(f.name).isNotNull(),
                           F.lit(f"{prefix}field {f.name!r} is not a valid {f.dataType.simpleString()}"))
    error = error.when(typed_row_failed, F.lit(f"{what} does not match the schema"))
    for name in required:
        error = error.when(F.col(tag).getField(name).isNull(),
                           F.lit(f"{prefix}required field {name!r} is missing or null"))
    if what == "value":
        error = F.when(F.col(column).isNull(), F.lit("value is null")).otherwise(error)
    return df, [f.name for f in declared.fields], error


def _parse_ddl(spark: SparkSession, ddl: str) -> StructType:
    from pyspark.sql.types import StructType

    try:
        parsed = StructType.fromDDL(ddl)  # needs the active session: parsing happens in the JVM
    except Exception as exc:  # Spark raises several parse error types
        raise ConfigurationError(f"schema {ddl!r} is not valid Spark DDL ('name TYPE [NOT NULL], ...'): {exc}") from exc
    if not isinstance(parsed, StructType):  # a lone type ('INT') parses too, but has no fields
        raise ConfigurationError(f"schema {ddl!r} is a single type, not a list of fields ('name TYPE [NOT NULL], ...')")
    return parsed
