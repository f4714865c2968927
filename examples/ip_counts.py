"""The IP-count example's producer and ground truth (tests, demo, soak; not installed).

    python -m examples.ip_counts --bootstrap 127.0.0.1:29092 --count 10000
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from datetime import datetime, timedelta, timezone

from airflow_eo.examples.ip_counts import (  # noqa: F401 (re-exported: one module per example for the tests)
    IPS,
    SINK,
    SOURCE,
    TIME_FORMAT,
    WINDOW_SECONDS,
    count_per_window_and_ip,
    ensure_topics,
)
from examples.topics import not_null, read_topic


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
