"""Exactly-once with an Avro topic under SIGKILL: page_views_avro_xa (Confluent-framed, two writer versions
interleaved) killed while its executors write, then retried: the sink equals the produced events."""

from __future__ import annotations

import io
import signal
import struct
from collections import Counter
from datetime import datetime, timezone

import fastavro
from confluent_kafka import Producer

from airflow_eo.examples import page_views
from examples.page_views import page_view
from tests.conftest import create_topic
from tests.integration.operator_harness import rows
from tests.integration.page_views import (
    batch_rows,
    committed_offsets,
    our_prepared_branches,
    reset,
    run_dag,
)

DAG_ID = PIPELINE = "page_views_avro_xa"


def produce_avro_page_views(bootstrap: str, topic: str, count: int, start: int) -> list[dict]:
    """Page views framed with schema id 1 or 2 in turn (version 1 has no ``ts``)."""
    schemas = {i: fastavro.parse_schema(s) for i, s in page_views.AVRO_WRITER_SCHEMAS.items()}
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    events = []
    for i in range(start, start + count):
        event, schema_id = page_view(), 1 + i % 2
        record = {k: v for k, v in event.items() if k != "ts"}
        if schema_id == 2:
            record["ts"] = datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schemas[schema_id], record)
        producer.produce(topic, b"\x00" + struct.pack(">I", schema_id) + out.getvalue(), key=event["app_id"].encode())
        events.append(event)
    assert producer.flush(60) == 0
    return events


def test_avro_topic_survives_sigkill_mid_write(bootstrap, mysql_kwargs, airflow_db, topic_name):
    """One crash is enough here: the crash chain at every step runs on JSON topics (test_crash.py); the format only
    changes how records are decoded, which a retry does again from the same offsets."""
    create_topic(bootstrap, topic_name, 2)
    reset(mysql_kwargs, PIPELINE)
    conf = {"topic": topic_name}
    events = produce_avro_page_views(bootstrap, topic_name, 1500, 0)
    logical_date = datetime.now(timezone.utc)
    crashed = run_dag(DAG_ID, logical_date, fault="during_write", conf=conf)
    assert crashed.returncode == -signal.SIGKILL, f"not killed mid-write: {crashed.stderr[-3000:]}"
    assert [b["state"] for b in batch_rows(mysql_kwargs, PIPELINE)] == ["planned"]
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM app_pv_avro")[0][0] == 0, "nothing visible before the commit"
    produce_avro_page_views(bootstrap, topic_name, 200, len(events))  # after the batch's ranges: not in it
    retried = run_dag(DAG_ID, logical_date, conf=conf)  # the same run again: resumes its batch
    assert retried.returncode == 0, retried.stdout[-3000:] + retried.stderr[-3000:]
    assert dict(rows(mysql_kwargs, "SELECT app_id, pv FROM app_pv_avro")) == dict(Counter(e["app_id"] for e in events))
    assert our_prepared_branches(mysql_kwargs, PIPELINE) == []
    assert sum(committed_offsets(mysql_kwargs, PIPELINE).values()) == len(events)
    assert [b["state"] for b in batch_rows(mysql_kwargs, PIPELINE)] == ["committed"]
