"""The IP-count example: requests per IP in 5-second tumbling windows, Kafka → Kafka.

Input lines on ``ip_count_source``: ``"yyyy-MM-dd_HH:mm:ss <ip>"``. Each batch emits one
record per (window, ip) it contributes to ``ip_count_sink``: key ``"<window_start>|<ip>"``,
JSON value with the window, ip, count and batch id. Summing ``count`` per key over the
committed output gives the true count per (window, ip). Its producer and ground truth are in the
repository's ``examples/ip_counts.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_eo.examples.topics import ensure_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_eo.core.batch import BatchContext

SOURCE, SINK = "ip_count_source", "ip_count_sink"
TIME_FORMAT = "%Y-%m-%d_%H:%M:%S"
WINDOW_SECONDS = 5
IPS = [f"10.0.{i // 16}.{i % 16 + 1}" for i in range(40)]


def count_per_window_and_ip(df: DataFrame, batch: BatchContext) -> DataFrame:
    """One output row per (5-second window, ip) in this batch, keyed ``window_start|ip``."""
    from pyspark.sql import functions as F

    parts = F.split(F.col("value"), " ")
    ts = F.try_to_timestamp(parts[0], F.lit("yyyy-MM-dd_HH:mm:ss"))
    where = F.concat_ws(" ", F.lit("bad line at"), "kafka_topic", "kafka_partition", F.lit("offset"), "kafka_offset")
    events = df.select(
        # A line that does not parse fails the batch, naming it: nothing is dropped silently.
        F.when(ts.isNull() | (F.size(parts) != 2), F.raise_error(where)).otherwise(ts).alias("ts"),
        parts[1].alias("ip"),
    )
    counted = events.groupBy(F.window("ts", f"{WINDOW_SECONDS} seconds"), "ip").count()
    start = F.date_format("window.start", "yyyy-MM-dd HH:mm:ss")
    end = F.date_format("window.end", "yyyy-MM-dd HH:mm:ss")
    value = F.to_json(F.struct(start.alias("window_start"), end.alias("window_end"), F.col("ip"),
                               F.col("count"), F.lit(batch.batch_id).alias("batch_id")))
    return counted.select(F.concat_ws("|", start, "ip").alias("key"), value.alias("value"))


def ensure_topics(bootstrap: str) -> None:
    ensure_topic(bootstrap, SOURCE, 3)
    ensure_topic(bootstrap, SINK, 3)
