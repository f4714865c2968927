"""``dedup_key`` on real Kafka, Spark and databases, in this process: the two SQL kinds the crash chains run without
it (``test_sink_crash_chains.py`` runs MySqlXaSink and PostgresUpsertSink with it, SIGKILLed at every step), bad
records beside copies, retention and its purge, and a rewind that replays the same decisions."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.rewind import RewindKind, RewindTarget
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.ops.lifecycle import PipelineLifecycle
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink, PostgresTwoPhaseSink
from airflow_eo.sqlsink.pipeline_owners import OWNER_TABLE
from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE
from examples.page_views import produce_page_views, resend_page_views
from examples.topics import read_topic
from tests.support.kafka import create_topic
from tests.support.operator_harness import example_table, operator, rows, run
from tests.support.postgres import COUNTS_DDL, EVENTS_DDL, PG_STORE
from tests.support.seen_ids import seen_rows
from tests.support.sql import database_query

NOW = datetime.now(timezone.utc)


def events_in(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    records, _ = read_topic(bootstrap, topic)
    return [json.loads(value) for _, value in records if value and value.startswith(b"{")]


@pytest.mark.parametrize("kind", ["MySqlUpsertSink", "PostgresTwoPhaseSink"])
def test_copies_count_once_and_bad_records_are_no_events(kind, bootstrap, airflow_db):
    topic = create_topic(bootstrap, f"dedup_{uuid.uuid4().hex[:8]}", 3)
    pipeline, table = f"dedup_{kind}_{topic}", f"dd_{uuid.uuid4().hex[:8]}"
    counts = kind == "PostgresTwoPhaseSink"
    spec = (PostgresTwoPhaseSink(table=table, key_columns=["app_id"], updates={"pv": "add"}) if counts
            else MySqlUpsertSink(table=table, key_columns=["event_id"]))
    adapter = build_sink(spec, pipeline, "eo_offset_store")
    query = database_query(adapter.database, adapter.connect_kwargs)  # type: ignore[attr-defined]
    query((COUNTS_DDL if counts else EVENTS_DDL).format(name=table))
    options: dict[str, Any] = {"dedup_key": ["event_id"], "on_bad_record": "dead_letter"}
    if counts:
        options["transform"] = "airflow_eo.examples.page_views.count_per_app"

    first = produce_page_views(bootstrap, 300, topic=topic, raw_values=[b"not json", b'{"app_id": 5}'])
    copies = len(resend_page_views(bootstrap, first, 60, topic=topic, seed=1))
    one = run(operator(topic, spec, pipeline, **options))
    assert (one["duplicates"], one["dead_letters"], one["records_in"]) == (copies, 2, 300 + 2 + copies)
    # events keyed by id, no transform: the write tasks mark the copies (no job of its own); counts: a job first
    assert ("dedup_mark" in one["seconds"]) is counts

    second = produce_page_views(bootstrap, 200, topic=topic)
    copies = len(resend_page_views(bootstrap, first + second, 50, topic=topic, seed=2))
    two = run(operator(topic, spec, pipeline, **options))
    assert (two["duplicates"], two["dead_letters"], two["records_in"]) == (copies, 0, 200 + copies)

    events = list({e["event_id"]: e for e in events_in(bootstrap, topic) if "event_id" in e}.values())
    assert len(events) == 500
    if counts:
        assert {r["app_id"]: r["pv"] for r in query(f'SELECT app_id, pv FROM "{table}"')} == \
            dict(Counter(e["app_id"] for e in events))
    else:
        assert sorted(r["event_id"] for r in query(f"SELECT event_id FROM `{table}`")) == \
            sorted(e["event_id"] for e in events)
    seen = seen_rows(adapter.database, adapter.connect_kwargs, pipeline)  # type: ignore[attr-defined]
    assert len(seen) == 500, "one seen id per event, none for a bad record"


def upsert_pipeline(bootstrap: str, name: str) -> tuple[str, str, MySqlUpsertSink, Any]:
    """A topic of two partitions, and an upsert pipeline writing its events by id into a fresh MySQL table:
    (topic, pipeline id, sink spec, the sink's adapter)."""
    topic = create_topic(bootstrap, f"{name}_{uuid.uuid4().hex[:8]}", 2)
    pipeline, table = f"{name}_{topic}", f"dd_{uuid.uuid4().hex[:8]}"
    spec = MySqlUpsertSink(table=table, key_columns=["event_id"])
    adapter = build_sink(spec, pipeline, "eo_offset_store")
    database_query(adapter.database, adapter.connect_kwargs)(EVENTS_DDL.format(name=table))  # type: ignore[attr-defined]
    return topic, pipeline, spec, adapter


def test_an_id_past_retention_counts_again_and_old_ids_are_purged(bootstrap, airflow_db):
    topic, pipeline, spec, adapter = upsert_pipeline(bootstrap, "dedup_ret")
    options = {"dedup_key": ["event_id"], "dedup_retention": timedelta(hours=1)}
    three_hours_ago = [NOW - timedelta(hours=3, seconds=-i) for i in range(100)]
    old = produce_page_views(bootstrap, 0, topic=topic, timestamps=three_hours_ago)
    assert run(operator(topic, spec, pipeline, **options))["duplicates"] == 0

    new = produce_page_views(bootstrap, 100, topic=topic)  # now: the old ids are past retention
    resent_old = resend_page_views(bootstrap, old[:30], 30, topic=topic, seed=3)
    resent_new = resend_page_views(bootstrap, new, 20, topic=topic, seed=4)
    done = run(operator(topic, spec, pipeline, **options))
    assert done["duplicates"] == len(resent_new) + (len(resent_old) - len({e["event_id"] for e in resent_old})), \
        "copies of the old events count again (once each); copies of this batch's own do not"
    kept = seen_rows(adapter.database, adapter.connect_kwargs, pipeline)
    assert len(kept) == len(new) + len({e["event_id"] for e in resent_old}), \
        "the ids past retention that no copy brought back were purged, the copies' seen anew"
    assert min(r["seen_at"] for r in kept) > (NOW - timedelta(hours=2)).timestamp() * 1000


def test_a_rewind_replays_the_same_decisions(bootstrap, airflow_db):
    topic, pipeline, spec, adapter = upsert_pipeline(bootstrap, "dedup_rw")
    query = database_query(adapter.database, adapter.connect_kwargs)
    events = produce_page_views(bootstrap, 200, topic=topic)
    copies = len(resend_page_views(bootstrap, events, 40, topic=topic, seed=5))
    first = run(operator(topic, spec, pipeline, dedup_key=["event_id"]))
    ops = pipeline_operations("eo_offset_store", "kafka_default")
    assert ops.rewind(pipeline, RewindTarget(RewindKind.EARLIEST), apply=True, reason="test").applied
    again = run(operator(topic, spec, pipeline, dedup_key=["event_id"]))
    assert first["duplicates"] == again["duplicates"] == copies and again["rows_out"] == first["rows_out"] == 200
    assert len(query(f"SELECT event_id FROM `{spec.table}`")) == 200
    produce_page_views(bootstrap, 1, topic=topic)  # one id: one of the two tasks gets an empty partition
    one = run(operator(topic, spec, pipeline, dedup_key=["event_id"]))
    assert (one["records_in"], one["duplicates"], one["rows_out"]) == (1, 0, 1)


def test_copies_are_known_by_a_field_of_the_records_key(bootstrap, airflow_db):
    """``dedup_key=["key.id"]``: a producer's retry re-sends the event under the same key with a value that differs
    (its attempt number), so only the key says they are one event."""
    from confluent_kafka import Producer

    topic = create_topic(bootstrap, f"dedup_key_{uuid.uuid4().hex[:8]}", 2)
    pipeline, table = f"dedup_key_{topic}", f"dk_{uuid.uuid4().hex[:8]}"
    spec = MySqlUpsertSink(table=table, key_columns=["event"])
    adapter = build_sink(spec, pipeline, "eo_offset_store")
    database_query(adapter.database, adapter.connect_kwargs)(  # type: ignore[attr-defined]
        f"CREATE TABLE `{table}` (event BIGINT PRIMARY KEY, attempt INT NOT NULL)")
    producer = Producer({"bootstrap.servers": bootstrap})
    for attempt, events in ((1, range(40)), (2, range(0, 40, 4))):  # then 10 retries of earlier events
        for event in events:
            producer.produce(topic, json.dumps({"event": event, "attempt": attempt}).encode(),
                             json.dumps({"id": event}).encode())
    assert producer.flush(30) == 0
    done = run(operator(topic, spec, pipeline, schema="event BIGINT, attempt INT", key_format="json",
                        key_schema="id BIGINT", dedup_key=["key.id"]))
    assert (done["records_in"], done["duplicates"], done["rows_out"]) == (50, 10, 40)
    stored = database_query(adapter.database, adapter.connect_kwargs)(  # type: ignore[attr-defined]
        f"SELECT event, attempt FROM `{table}`")
    assert sorted((r["event"], r["attempt"]) for r in stored) == [(e, 1) for e in range(40)]


def test_the_purge_never_waits_on_the_ids_a_prepared_branch_holds(mysql_kwargs):
    """The purge runs after the write tasks prepared their branches (MySQL/MariaDB XA): it removes the old ids and
    leaves, without waiting on the new ids next to them in the age index (it did wait, its whole lock wait, when it
    deleted by a range of that index)."""
    import time

    from airflow_eo.mysql.database import DATABASE as MYSQL
    from airflow_eo.sqlsink.seen_ids import PURGE_LOCK_WAIT_S, SEEN_ID_TABLE, create_seen_id_table, purge_seen_ids

    create_seen_id_table(MYSQL, mysql_kwargs, SEEN_ID_TABLE)
    key = seen_pipeline_key(f"purge_{uuid.uuid4().hex}")
    insert = (f"INSERT INTO {SEEN_ID_TABLE} (pipeline_key, event_id, topic, kafka_partition, kafka_offset, seen_at, "
              "batch_id) VALUES (%s, %s, 't', 0, %s, %s, %s)")
    conn = MYSQL.connect(mysql_kwargs, autocommit=True)
    xid = f"purge-test-{uuid.uuid4().hex[:12]}"
    try:
        with conn.cursor() as cur:
            for i in range(3):  # old ids, committed
                cur.execute(insert, (key, bytes(15) + bytes([2 * i]), i, 1_000 + i, 1))
            cur.execute(f"XA START '{xid}'")
            for i in range(3):  # the running batch's ids, prepared: next to the old ones in both indexes
                cur.execute(insert, (key, bytes(15) + bytes([2 * i + 1]), 10 + i, 10_000_000 + i, 2))
            cur.execute(f"XA END '{xid}'")
            cur.execute(f"XA PREPARE '{xid}'")
        started = time.monotonic()
        assert purge_seen_ids(MYSQL, mysql_kwargs, SEEN_ID_TABLE, key, 5_000, 100) == 3
        assert time.monotonic() - started < PURGE_LOCK_WAIT_S / 2
    finally:
        with conn.cursor() as cur:
            cur.execute(f"XA ROLLBACK '{xid}'")
            cur.execute(f"DELETE FROM {SEEN_ID_TABLE} WHERE pipeline_key = %s", (key,))
        conn.close()


def test_a_record_whose_dedup_key_is_all_null_is_kept_and_never_remembered():
    """``dedup_key=["key"]`` with producers sending null keys: a record whose key columns are all NULL (a struct
    column: NULL or every field NULL) names no event, so it has no id: never a copy, never in the seen-id table.
    Before, all of them hashed ``{}`` to one id and every one after the first was dropped as a copy."""
    from airflow_eo.spark.dedup import DUPLICATE, ID, NEW, mark_duplicates, with_event_ids
    from airflow_eo.spark.session import get_session

    spark = get_session()
    parsed = spark.createDataFrame(
        [(None, None, ("k1",), None, 0), (None, None, (None,), None, 1), (None, None, None, None, 2),
         ("a", None, None, None, 3), ("a", None, None, None, 4), (None, 7, None, None, 5),
         (None, None, None, "bad", 6)],
        "key STRING, n INT, s STRUCT<id: STRING>, _eo_error STRING, kafka_offset BIGINT")
    parsed = parsed.selectExpr("*", "'t' AS kafka_topic", "0 AS kafka_partition",
                               "TIMESTAMP'2026-01-01 00:00:00' AS kafka_timestamp")
    by_key = {r["kafka_offset"]: r[ID] for r in with_event_ids(parsed, ["key", "n"]).collect()}
    assert [o for o, i in sorted(by_key.items()) if i is None] == [0, 1, 2, 6]  # all NULL, and the bad record
    assert by_key[3] == by_key[4] and len({bytes(by_key[3]), bytes(by_key[5])}) == 2
    by_struct = {r["kafka_offset"]: r[ID] for r in with_event_ids(parsed, ["s"]).collect()}
    assert [o for o, i in sorted(by_struct.items()) if i is None] == [1, 2, 3, 4, 5, 6]
    marked = mark_duplicates(with_event_ids(parsed, ["key", "n"]), lambda ids: {}, timedelta(days=1), 2)
    marks = {r["kafka_offset"]: (r[DUPLICATE], r[NEW]) for r in marked.collect()}
    assert marks == {0: (False, False), 1: (False, False), 2: (False, False), 3: (False, True), 4: (True, False),
                     5: (False, True), 6: (False, False)}


def test_the_purge_removes_every_id_past_retention_not_one_chunk_per_batch(airflow_db, monkeypatch):
    """A batch of a million new ids must not leave the seen-id table longer by all but the purge's chunk once
    retention has passed: the purge goes on, chunk by chunk, until it is caught up."""

    from airflow_eo.spark import dedup as spark_dedup
    from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE, create_seen_id_table

    pipeline = f"dedup_purge_{uuid.uuid4().hex[:8]}"
    adapter = build_sink(MySqlUpsertSink(table=f"dd_{uuid.uuid4().hex[:8]}", key_columns=["event_id"]), pipeline,
                         "eo_offset_store")
    create_seen_id_table(adapter.database, adapter.connect_kwargs, SEEN_ID_TABLE)  # type: ignore[attr-defined]
    key = seen_pipeline_key(pipeline)
    now_ms = int(NOW.timestamp() * 1000)
    conn = adapter.database.connect(adapter.connect_kwargs, autocommit=True)  # type: ignore[attr-defined]
    try:
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {SEEN_ID_TABLE} (pipeline_key, event_id, topic, kafka_partition, "
                            "kafka_offset, seen_at, batch_id) VALUES (%s, %s, 't', 0, %s, %s, 1)",
                            [(key, i.to_bytes(16, "big"), i, now_ms - (7_200_000 if i < 25 else 60_000))
                             for i in range(30)])
        monkeypatch.setattr(spark_dedup, "PURGE_LIMIT", 10)
        spark_dedup.purge_seen_ids(adapter, pipeline, now_ms, timedelta(hours=1))  # type: ignore[arg-type]
        assert sorted(r["kafka_offset"] for r in seen_rows(adapter.database, adapter.connect_kwargs, pipeline)) \
            == list(range(25, 30)), "every id past retention went, the recent ones stayed"
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {SEEN_ID_TABLE} WHERE pipeline_key = %s", (key,))
        conn.close()


def test_one_pipeline_id_run_from_a_second_offset_store_is_refused_not_mixed(bootstrap, mysql_kwargs, airflow_db,
                                                                             monkeypatch):
    """Two offset stores (the stack's MariaDB and PostgreSQL) each running a pipeline of one id against one sink
    database, on topics that carry the same events (a second deployment reading a replica): the seen-id rows there are
    the first store's pipeline's. Without the owner check the second's batch took every event for a copy of the
    first's and wrote none of them (events lost). It is refused before anything is written; the first store's
    pipeline goes on; retire frees the id, and the other store's pipeline then writes every event."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    suffix = uuid.uuid4().hex[:8]
    topic, replica = (create_topic(bootstrap, f"dedup_{name}_{suffix}", 3) for name in ("own", "replica"))
    pipeline = f"dedup_owner_{suffix}"
    tables = [example_table(mysql_kwargs, "page_view_events") for _ in range(2)]
    options: dict[str, Any] = {"dedup_key": ["event_id"]}

    def pipeline_of(store: str, table: str, source: str) -> Any:
        return operator(source, MySqlXaSink(table=table, key_columns=["event_id"]), pipeline,
                        offset_store_conn_id=store, **options)

    events = produce_page_views(bootstrap, 100, topic=topic)
    first = run(pipeline_of("eo_offset_store", tables[0], topic))
    assert (first["rows_out"], first["duplicates"]) == (100, 0)
    sent = resend_page_views(bootstrap, events, 100, topic=replica, seed=5)  # the same events, on the replica

    with pytest.raises(ConfigurationError, match="belong to a pipeline of the same id in another offset store"):
        run(pipeline_of(PG_STORE, tables[1], replica))
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {tables[1]}") == [(0,)]

    produce_page_views(bootstrap, 50, topic=topic)  # the owner goes on
    assert run(pipeline_of("eo_offset_store", tables[0], topic))["rows_out"] == 50
    retired = PipelineLifecycle(pipeline_operations("eo_offset_store")).retire(pipeline, apply=True, reason="moved",
                                                                               idle_s=0)
    assert retired.removed[OWNER_TABLE] == 1 and retired.removed[SEEN_ID_TABLE] == 150
    moved = run(pipeline_of(PG_STORE, tables[1], replica))  # the id is free: every event of the replica is new
    distinct = {e["event_id"] for e in sent}
    assert (moved["rows_out"], moved["duplicates"]) == (len(distinct), len(sent) - len(distinct))
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {tables[1]}") == [(len(distinct),)]
