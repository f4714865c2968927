"""Exactly-once with an Avro topic under SIGKILL: page_views_avro_xa (Confluent-framed, two writer versions
interleaved) killed while its executors write, then retried: the sink equals the produced events."""

from __future__ import annotations

import signal
from collections import Counter
from datetime import datetime, timezone

from examples.page_views import page_view, produce_avro_page_views
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.operator_harness import rows
from tests.support.page_views import (
    batch_rows,
    committed_offsets,
    our_prepared_branches,
    reset,
    run_dag,
)

DAG_ID = PIPELINE = "page_views_avro_xa"


def test_avro_topic_survives_sigkill_mid_write(bootstrap, mysql_kwargs, airflow_db, topic_name):
    """One crash is enough here: the crash chain at every step runs on JSON topics (test_crash.py); the format only
    changes how records are decoded, which a retry does again from the same offsets."""
    create_topic(bootstrap, topic_name, 2)
    reset(mysql_kwargs, PIPELINE)
    conf = {"topic": topic_name}
    events = [page_view() for _ in range(1500)]  # framed with writer schema ids 1 and 2 in turn
    produce_avro_page_views(bootstrap, topic_name, events)
    logical_date = datetime.now(timezone.utc)
    crashed = run_dag(DAG_ID, logical_date, fault="during_write", conf=conf)
    assert crashed.returncode == -signal.SIGKILL, f"not killed mid-write: {why(crashed)}"
    assert [b["state"] for b in batch_rows(mysql_kwargs, PIPELINE)] == ["planned"]
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM app_pv_avro")[0][0] == 0, "nothing visible before the commit"
    produce_avro_page_views(bootstrap, topic_name, [page_view() for _ in range(200)])  # after the batch: not in it
    retried = run_dag(DAG_ID, logical_date, conf=conf)  # the same run again: resumes its batch
    assert retried.returncode == 0, why(retried)
    assert dict(rows(mysql_kwargs, "SELECT app_id, pv FROM app_pv_avro")) == dict(Counter(e["app_id"] for e in events))
    assert our_prepared_branches(mysql_kwargs, PIPELINE) == []
    assert sum(committed_offsets(mysql_kwargs, PIPELINE).values()) == len(events)
    assert [b["state"] for b in batch_rows(mysql_kwargs, PIPELINE)] == ["committed"]
