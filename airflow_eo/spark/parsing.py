"""Records to rows on Spark: a batch's Kafka values parsed by its value format, bad records marked, not dropped.

Every value format is parsed here (string, bytes, JSON with a Spark DDL schema); the row keeps its Kafka metadata and
an ``_eo_error`` column that is NULL for a good record and says what is wrong with a bad one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_eo.core.config import ParseConfig, ValueFormat
from airflow_eo.core.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

METADATA_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "kafka_key")


def parse_records(spark: SparkSession, raw: DataFrame, parse: ParseConfig) -> tuple[DataFrame, list[str]]:
    """Parsed columns + metadata + ``_eo_error`` (NULL for good records); returns payload column names."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    if parse.value_format is not ValueFormat.JSON:
        value = F.col("kafka_value")
        if parse.value_format is ValueFormat.STRING:
            value = value.cast("string")
        error = F.when(F.col("kafka_value").isNull(), F.lit("value is null"))
        if parse.value_format is ValueFormat.STRING:
            error = error.when(~F.is_valid_utf8(value), F.lit("value is not valid UTF-8"))
        columns: list[Column | str] = [value.alias("value"), *METADATA_COLUMNS, "kafka_value",
                                       error.alias("_eo_error")]
        return raw.select(*columns), ["value"]

    declared = _parse_ddl(spark, parse.schema or "")
    required = [f.name for f in declared.fields if not f.nullable]
    parse_schema = StructType([StructField(f.name, f.dataType, True) for f in declared.fields]
                              + [StructField("_eo_corrupt", StringType(), True)])
    as_text = StructType([StructField(f.name, StringType(), True) for f in declared.fields]
                         + [StructField("_eo_corrupt", StringType(), True)])
    text = F.col("kafka_value").cast("string")
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_eo_corrupt"}
    # Each parse is the output of a Generate (explode of a one-element array): a filter on the error below
    # cannot be pushed beneath it, where Spark would inline from_json into every reference (measured: a filter
    # on _eo_error then parsed each value ~20 times).
    df = raw.withColumn("_eo_parsed", F.explode(F.array(F.from_json(text, parse_schema, options))))
    typed_row_failed = F.col("_eo_parsed").isNull() | F.col("_eo_parsed._eo_corrupt").isNotNull()
    # Only a value whose typed parse failed is parsed again, with every field as STRING: that tells malformed
    # JSON apart from a field of the wrong type (Spark nulls the whole typed row in both cases). Good records
    # are parsed once.
    df = df.withColumn("_eo_text", F.explode(F.array(F.when(typed_row_failed,
                                                            F.from_json(text, as_text, options)))))
    # A cast keeps a value's bytes as they are: invalid UTF-8 would reach the sink as mojibake.
    error = F.when(F.col("kafka_value").isNull(), F.lit("value is null")).when(
        ~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")).when(
        typed_row_failed & (F.col("_eo_text").isNull() | F.col("_eo_text._eo_corrupt").isNotNull()),
        F.lit("malformed JSON"))
    for f in declared.fields:
        typed = F.col(f"_eo_parsed.{f.name}")
        if not isinstance(f.dataType, StringType):
            typed = F.when(typed_row_failed, F.col(f"_eo_text.{f.name}").try_cast(f.dataType)).otherwise(typed)
        error = error.when(typed.isNull() & F.col(f"_eo_text.{f.name}").isNotNull(),
                           F.lit(f"field {f.name!r} is not a valid {f.dataType.simpleString()}"))
    error = error.when(typed_row_failed, F.lit("value does not match the schema"))
    for name in required:
        error = error.when(F.col(f"_eo_parsed.{name}").isNull(),
                           F.lit(f"required field {name!r} is missing or null"))
    payload = [f.name for f in declared.fields]
    return df.select(*[F.col(f"_eo_parsed.{n}").alias(n) for n in payload], *METADATA_COLUMNS, "kafka_value",
                     error.alias("_eo_error")), payload


def _parse_ddl(spark: SparkSession, ddl: str) -> StructType:
    from pyspark.sql.types import StructType

    try:
        parsed = StructType.fromDDL(ddl)  # needs the active session: parsing happens in the JVM
    except Exception as exc:  # Spark raises several parse error types
        raise ConfigurationError(f"schema {ddl!r} is not valid Spark DDL ('name TYPE [NOT NULL], ...'): {exc}") from exc
    if not isinstance(parsed, StructType):  # a lone type ('INT') parses too, but has no fields
        raise ConfigurationError(f"schema {ddl!r} is a single type, not a list of fields ('name TYPE [NOT NULL], ...')")
    return parsed

