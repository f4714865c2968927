"""Recorded Kafka records as the DataFrame the engine's ``read`` gives (its ``kafka_*`` columns), for tests of the
parsers that start after the read."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any


def kafka_frame(spark: Any, records: Sequence[dict[str, Any]], keys: Sequence[bytes | None],
                values: Sequence[bytes | None]) -> Any:
    """``records`` (topic, partition, offset) with the given key and value bytes, stamped now, no headers."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType([StructField("kafka_key", BinaryType()), StructField("kafka_value", BinaryType()),
                         StructField("kafka_topic", StringType()), StructField("kafka_partition", IntegerType()),
                         StructField("kafka_offset", LongType()), StructField("kafka_timestamp", TimestampType()),
                         StructField("kafka_headers", ArrayType(header))])
    now = datetime.now(timezone.utc)
    rows = [(key, value, r["topic"], r["partition"], r["offset"], now, [])
            for r, key, value in zip(records, keys, values, strict=True)]
    return spark.createDataFrame(rows, schema)
