"""The IP-count example: requests per IP in 5-second tumbling windows, Kafka → Kafka.

Input lines on ``ip_count_source``: ``"yyyy-MM-dd_HH:mm:ss <ip>"``. Each batch emits one
record per (window, ip) it contributes to ``ip_count_sink``: key ``"<window_start>|<ip>"``,
JSON value with the window, ip, count and batch id. Summing ``count`` per key over the
committed output gives the true count per (window, ip). Producer::

    python -m airflow_eo.examples.ip_counts --bootstrap 127.0.0.1:29092 --count 10000
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from airflow_eo.examples.topics import ensure_topic, not_null, read_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_eo.core.protocol import BatchContext

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


def produce_lines(bootstrap: str, count: int, start: datetime | None = None, topic: str = SOURCE) -> list[str]:
    """``count`` request lines, a few per second from ``start``, random IPs; returns them."""
    from confluent_kafka import Producer

    ensure_topics(bootstrap)
    moment = start or datetime.now(timezone.utc).replace(microsecond=0)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "queue.buffering.max.messages": 1_000_000})
    lines = []
    for _ in range(count):
        moment += timedelta(milliseconds=random.randrange(0, 400))
        line = f"{moment.strftime(TIME_FORMAT)} {random.choice(IPS)}"
        lines.append(line)
        while True:
            try:
                producer.produce(topic, line.encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("not every line was delivered within 60s")
    return lines


def window_key(line: str) -> str:
    stamp, ip = line.split(" ")
    moment = datetime.strptime(stamp, TIME_FORMAT)
    start = moment - timedelta(seconds=moment.second % WINDOW_SECONDS)
    return f"{start.strftime('%Y-%m-%d %H:%M:%S')}|{ip}"


def true_counts(bootstrap: str) -> dict[str, int]:
    """Requests per ``window_start|ip`` computed from the input topic (not from our pipeline)."""
    return dict(Counter(window_key(not_null(value).decode()) for _, value in read_topic(bootstrap, SOURCE)[0]))


def output_counts(bootstrap: str, isolation: str = "read_committed") -> dict[str, int]:
    """The committed output summed per key, as a downstream read_committed consumer sees it."""
    sums: Counter[str] = Counter()
    for key, value in read_topic(bootstrap, SINK, isolation)[0]:
        sums[not_null(key).decode()] += json.loads(not_null(value))["count"]
    return dict(sums)


def main() -> None:
    parser = argparse.ArgumentParser(description="Produce 'yyyy-MM-dd_HH:mm:ss <ip>' lines to Kafka")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--count", type=int, default=10_000)
    args = parser.parse_args()
    produce_lines(args.bootstrap, args.count)
    print(f"produced {args.count} lines to {SOURCE}")


if __name__ == "__main__":
    main()
