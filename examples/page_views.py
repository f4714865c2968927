"""The page-views example's producer and ground truth (tests, demo, soak, benchmark; not installed).

    python -m examples.page_views --bootstrap 127.0.0.1:29092 --count 1000
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from airflow_eo.examples.page_views import (  # noqa: F401 (re-exported: one module per example for the tests)
    APPS,
    AVRO_SCHEMA,
    AVRO_WRITER_SCHEMAS,
    ON_ARRIVAL,
    PARTITIONS,
    POSTGRES_TABLES_DDL,
    SCHEMA,
    TABLES_DDL,
    TOPIC,
    count_per_app,
    create_table_like,
    ensure_postgres_tables,
    ensure_tables,
)
from airflow_eo.examples.topics import ensure_topic
from examples.topics import not_null, read_topic


def page_view(app_id: str | None = None, at: datetime | None = None) -> dict[str, Any]:
    moment = (at or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return {
        "event_id": uuid.uuid4().hex,
        "app_id": app_id or random.choice(APPS),
        "user_id": f"user_{random.randrange(10_000)}",
        "ts": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


def produce_page_views(bootstrap: str, count: int, topic: str = TOPIC, raw_values: Sequence[bytes] = (),
                       timestamps: Sequence[datetime] = (),
                       raw_headers: Sequence[Sequence[tuple[str, bytes | None]]] = (),
                       kept: float = 1.0, spread_over: int = 0) -> list[dict[str, Any]]:
    """Produce ``count`` events with unique ids (idempotent producer) and return them (with ``kept`` < 1, about that
    share of them, picked at random: a benchmark's million events need not stay in its memory).

    ``raw_values`` are produced as they are (bad records for the tests), the i-th with the Kafka headers
    ``raw_headers[i % len(raw_headers)]`` when given (in order; an empty list: none). ``timestamps``
    (ascending, one per event, replacing ``count``) set both the event's ``ts`` and the
    Kafka record timestamp, as a producer replaying past hours would (interval mode). With ``spread_over`` (the
    topic's partition count), the i-th event goes to partition i % ``spread_over`` instead of its app's: every
    partition gets its share.
    """
    if timestamps:
        count = len(timestamps)
    ensure_topic(bootstrap, topic)
    producer = _producer(bootstrap)
    events = []
    for i in range(count):
        at = timestamps[i] if timestamps else None
        event = page_view(at=at)
        if kept >= 1.0 or random.random() < kept:
            events.append(event)
        timestamp_ms = int(at.timestamp() * 1000) if at else 0  # 0: the producer's clock, produce()'s default
        _send(producer, topic, json.dumps(event).encode(), event["app_id"].encode(), timestamp_ms,
              i % spread_over if spread_over else None)
    for i, value in enumerate(raw_values):
        headers = list(raw_headers[i % len(raw_headers)]) if raw_headers else None
        producer.produce(topic, value, headers=headers or None)
    if producer.flush(60) != 0:
        raise RuntimeError("not every page view was delivered within 60s")
    return events


def resend_page_views(bootstrap: str, events: Sequence[dict[str, Any]], count: int, topic: str = TOPIC,
                      seed: int | None = None) -> list[dict[str, Any]]:
    """Re-send ``count`` of ``events`` (chosen at random, an event maybe more than once), as an at-least-once
    producer does after a timeout: the same value at a new offset, every other one under another key (so it may
    land in another partition, as a re-run upstream job's copy would). Returns the copies sent."""
    chosen = random.Random(seed).choices(list(events), k=count) if events else []
    producer = _producer(bootstrap)
    for i, event in enumerate(chosen):
        key = event["app_id"].encode() if i % 2 == 0 else f"resent-{i}".encode()
        _send(producer, topic, json.dumps(event).encode(), key)
    if producer.flush(60) != 0:
        raise RuntimeError("not every re-sent page view was delivered within 60s")
    return chosen


def produce_avro_page_views(bootstrap: str, topic: str, events: Sequence[dict[str, Any]],
                            schema_ids: Sequence[int] = (1, 2)) -> None:
    """``events`` (as :func:`page_view` makes them) as Confluent-framed Avro, keyed by app like the JSON ones: the
    i-th with writer schema id ``schema_ids[i % len(schema_ids)]`` of ``AVRO_WRITER_SCHEMAS`` (1 has no ``ts``)."""
    import io
    import struct

    import fastavro

    schemas = {i: fastavro.parse_schema(s) for i, s in AVRO_WRITER_SCHEMAS.items()}
    headers = {i: b"\x00" + struct.pack(">I", i) for i in schemas}
    producer = _producer(bootstrap)
    for i, event in enumerate(events):
        schema_id = schema_ids[i % len(schema_ids)]
        record = {k: v for k, v in event.items() if k != "ts"}
        if schema_id == 2:
            record["ts"] = datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))
        out = io.BytesIO(headers[schema_id])
        out.seek(0, io.SEEK_END)
        fastavro.schemaless_writer(out, schemas[schema_id], record)
        _send(producer, topic, out.getvalue(), event["app_id"].encode())
    if producer.flush(60) != 0:
        raise RuntimeError("not every Avro page view was delivered within 60s")


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                     "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000})


def _send(producer: Any, topic: str, value: bytes, key: bytes, timestamp_ms: int = 0,
          partition: int | None = None) -> None:
    where = {} if partition is None else {"partition": partition}  # None: the key's partition
    while True:
        try:
            producer.produce(topic, value, key=key, timestamp=timestamp_ms, **where)
            break
        except BufferError:  # the local queue is full: let it drain
            producer.poll(0.1)
    producer.poll(0)


def ground_truth(bootstrap: str, topic: str = TOPIC, per_event: bool = False
                 ) -> tuple[dict[str, int], set[str], dict[int, int]]:
    """(page views per app, event ids, end offset per partition) of every committed record in the topic;
    ``per_event``: each event id counted once however often it was sent (``dedup_key=["event_id"]``)."""
    from collections import Counter

    records, ends = read_topic(bootstrap, topic)
    events = [json.loads(not_null(value)) for _, value in records]
    if per_event:
        events = list({e["event_id"]: e for e in events}.values())
    return dict(Counter(e["app_id"] for e in events)), {e["event_id"] for e in events}, ends


def main() -> None:
    parser = argparse.ArgumentParser(description="Produce page-view events with unique ids to Kafka")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--topic", default=TOPIC)
    args = parser.parse_args()
    started = time.monotonic()
    produce_page_views(args.bootstrap, args.count, args.topic)
    print(f"produced {args.count} page views to {args.topic} in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
