"""``airflow eo prune`` on the real offset stores (MariaDB, PostgreSQL): with an in-doubt batch present it keeps that
batch and the last committed one, removes the old committed ones and old audit rows in bounded statements, and the
pipeline's next batch still plans and commits where the last one left off; verify's tiling finds no gap."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from airflow_eo.core.batch import BatchRecord, BatchSummary
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.errors import OperationError
from airflow_eo.core.history import PRUNE_ACTION
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.verify import audited_moves, check_tiling
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.ops.history import HistoryPruner
from airflow_eo.sqlstore.store import SqlOffsetStore

PG_STORE = "eo_history_pg_store"
DAYS_90 = 90 * 86400


@pytest.fixture(params=["eo_offset_store", PG_STORE])
def store_conn(request, monkeypatch) -> str:
    if request.param == PG_STORE:
        monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    return request.param


@pytest.fixture
def pipeline(store_conn) -> Iterator[str]:
    pipeline_id = f"prune_{uuid.uuid4().hex[:10]}"
    yield pipeline_id
    store = OffsetStoreHook(store_conn).get_store()
    with store.transaction() as cur:
        for table in ("eo_batch", "eo_offset", "eo_audit", "eo_pipeline"):
            cur.execute(f"DELETE FROM {table} WHERE pipeline_id = %s", (pipeline_id,))


def run_batch(store: SqlOffsetStore, pipeline_id: str, epoch: int, size: int, commit: bool = True) -> BatchRecord:
    """Plan a batch of ``size`` records of partition 0 from the committed offset (as the planner does), and commit
    it (or leave it prepared: in doubt)."""
    start = store.committed_offsets(pipeline_id).get(("t", 0), 0)
    batch = store.insert_batch(pipeline_id, epoch, f"run-{uuid.uuid4().hex[:8]}", [OffsetRange("t", 0, start,
                                                                                                start + size)], [])
    if commit:
        store.commit_batch(batch, epoch, BatchSummary.of(batch, batch.run_id, epoch))
    else:
        store.mark_prepared(batch, epoch, [])
    return batch


def age(store: SqlOffsetStore, pipeline_id: str, below_batch: int, days: int) -> None:
    """Make the first batches ``days`` old (and every audit row so far older), as a year of runs would have."""
    then = (datetime.now(timezone.utc) - timedelta(days=days)).replace(tzinfo=None)
    with store.transaction() as cur:
        cur.execute(store.dialect.utc_session)
        cur.execute("UPDATE eo_batch SET created_at = %s, updated_at = %s WHERE pipeline_id = %s AND batch_id < %s",
                    (then, then, pipeline_id, below_batch))
        cur.execute("UPDATE eo_audit SET created_at = %s WHERE pipeline_id = %s", (then - timedelta(days=1),
                                                                                    pipeline_id))


def test_prune_keeps_the_in_doubt_batch_and_the_last_committed_one_and_the_next_batch_commits(store_conn, pipeline):
    store = OffsetStoreHook(store_conn).get_store()
    epoch = store.take_pipeline(pipeline)
    for _ in range(7):  # batches 0..6 committed
        run_batch(store, pipeline, epoch, 10)
    store.record_audit(pipeline, "me", "rewind", "an old operation", {})
    in_doubt = run_batch(store, pipeline, epoch, 10, commit=False)  # batch 7: prepared, its run killed
    age(store, pipeline, 8, days=200)  # everything is old, the in-doubt batch too
    assert (in_doubt.batch_id, store.latest_committed_batch_id(pipeline)) == (7, 6)

    pruner = HistoryPruner(pipeline_operations(store_conn), chunk=4)
    dry = pruner.prune(DAYS_90, pipeline_id=pipeline)
    assert [(p.batches, p.audit_rows, p.kept_below) for p in dry.pipelines] == [(6, 1, 6)]
    assert len(store.batch_history(pipeline, 100)) == 8  # a dry run changes nothing
    with pytest.raises(OperationError, match="--reason"):
        pruner.prune(DAYS_90, pipeline_id=pipeline, apply=True)
    done = pruner.prune(DAYS_90, pipeline_id=pipeline, apply=True, reason="retention")
    assert [(p.batches, p.audit_rows) for p in done.pipelines] == [(6, 1)], done.to_dict()
    left = {b.record.batch_id: b.record.state for b in store.batch_history(pipeline, 100)}
    assert left == {6: BatchState.COMMITTED, 7: BatchState.PREPARED}
    assert [a.action for a in store.audit_log(pipeline, 10)] == [PRUNE_ACTION]

    # The in-doubt batch is resolved (its run is dead: aborted), then the next batch plans after it and commits
    # exactly where batch 6 left partition 0.
    epoch = store.take_pipeline(pipeline)
    store.abort_batch(store.get_batch(pipeline, 7), epoch)  # type: ignore[arg-type]
    nxt = run_batch(store, pipeline, epoch, 5)
    assert (nxt.batch_id, nxt.ranges) == (8, [OffsetRange("t", 0, 70, 75)])
    assert store.committed_offsets(pipeline) == {("t", 0): 75}
    batches = [b.record for b in store.batch_history(pipeline, 100)]
    assert check_tiling(batches, store.committed_offsets(pipeline), audited_moves(store.audit_log(pipeline, 100))) \
        == []
    # Pruned again: batch 6 is old and no longer the last committed one, so it goes; batch 7 (aborted just now) and
    # 8 stay; the first prune's row stays (audit rows newer than the oldest kept batch are kept); the tiling reads
    # where the two prunes left partition 0.
    again = pruner.prune(DAYS_90, pipeline_id=pipeline, apply=True, reason="retention")
    assert [(p.batches, p.audit_rows, p.pruned_through) for p in again.pipelines] == [(1, 0, 6)]
    assert sorted(b.record.batch_id for b in store.batch_history(pipeline, 100)) == [7, 8]
    assert [a.action for a in store.audit_log(pipeline, 10)] == [PRUNE_ACTION, PRUNE_ACTION]
    batches = [b.record for b in store.batch_history(pipeline, 100)]
    assert check_tiling(batches, store.committed_offsets(pipeline), audited_moves(store.audit_log(pipeline, 100))) \
        == []


def test_prune_keeps_a_committed_batch_whose_xa_branch_is_still_prepared(mysql_kwargs):
    """A committed batch whose XA branch is still prepared (its run died between the store's commit point and the
    branch's commit): ``recover`` commits that branch because the store records the batch committed, so prune keeps
    the row (and its dead letters) while the branch is in doubt; it goes once the branch is resolved. The dead letters
    of the batches pruned go with them, in the sink's database."""
    import pymysql

    from airflow_eo.core.xid import Xid, pipeline_key
    from airflow_eo.sinks import MySqlXaSink

    store = OffsetStoreHook("eo_offset_store").get_store()
    pipeline, table = f"prune_xa_{uuid.uuid4().hex[:10]}", f"prune_xa_{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(**mysql_kwargs, autocommit=True)
    dead_letters = f"{table}_dl"
    admin.cursor().execute(f"CREATE TABLE {table} (k INT PRIMARY KEY)")
    admin.cursor().execute(f"CREATE TABLE {dead_letters} (pipeline_id VARCHAR(190) NOT NULL, "
                           "topic VARCHAR(249) NOT NULL, kafka_partition INT NOT NULL, kafka_offset BIGINT NOT NULL, "
                           "batch_id BIGINT NOT NULL, error TEXT NOT NULL, "
                           "PRIMARY KEY (pipeline_id, topic, kafka_partition, kafka_offset))")
    xid = None
    try:
        spec = MySqlXaSink(table=table, key_columns=["k"], dead_letter_table=dead_letters)
        epoch = store.take_pipeline(pipeline, sink=spec.record())
        for batch_id in range(5):  # batches 0..4 committed (4 is the last), each with a dead letter
            run_batch(store, pipeline, epoch, 10)
            admin.cursor().execute(f"INSERT INTO {dead_letters} VALUES (%s, 't', 0, %s, %s, 'bad')",
                                   (pipeline, batch_id * 10, batch_id))
        # another pipeline's dead letter of the same batch id in the same table stays
        admin.cursor().execute(f"INSERT INTO {dead_letters} VALUES ('other', 't', 0, 0, 0, 'bad')")
        xid = Xid(pipeline_key(pipeline), 1, epoch, 0)
        holder = pymysql.connect(**mysql_kwargs)
        with holder.cursor() as cur:  # batch 1's branch, prepared and left (its connection closes)
            cur.execute(f"XA START {xid.sql()}")
            cur.execute(f"INSERT INTO {table} (k) VALUES (1)")
            cur.execute(f"XA END {xid.sql()}")
            cur.execute(f"XA PREPARE {xid.sql()}")
        holder.close()
        age(store, pipeline, 5, days=200)
        pruner = HistoryPruner(pipeline_operations("eo_offset_store"))
        done = pruner.prune(DAYS_90, pipeline_id=pipeline, apply=True, reason="retention")
        assert [(p.batches, p.kept_below, p.dead_letters) for p in done.pipelines] == [(3, 4, 3)], done.to_dict()
        assert sorted(b.record.batch_id for b in store.batch_history(pipeline, 100)) == [1, 4]
        cur = admin.cursor()
        cur.execute(f"SELECT pipeline_id, batch_id FROM {dead_letters} ORDER BY pipeline_id, batch_id")
        assert cur.fetchall() == (("other", 0), (pipeline, 1), (pipeline, 4))
        admin.cursor().execute(f"XA COMMIT {xid.sql()}")  # resolved (as recover would: the batch is committed)
        xid = None
        again = pruner.prune(DAYS_90, pipeline_id=pipeline, apply=True, reason="retention")
        assert [(p.batches, p.dead_letters) for p in again.pipelines] == [(1, 1)]
        assert [b.record.batch_id for b in store.batch_history(pipeline, 100)] == [4]
    finally:
        if xid is not None:
            admin.cursor().execute(f"XA ROLLBACK {xid.sql()}")
        admin.cursor().execute(f"DROP TABLE IF EXISTS {table}, {dead_letters}")
        admin.close()
        with store.transaction() as cur:
            for t in ("eo_batch", "eo_offset", "eo_audit", "eo_pipeline"):
                cur.execute(f"DELETE FROM {t} WHERE pipeline_id = %s", (pipeline,))


def test_prune_removes_the_dead_letters_of_pruned_batches_on_postgresql(postgres_kwargs):
    """The same removal with the sink's dead letters on PostgreSQL (an upsert sink: nothing in doubt)."""
    import psycopg

    from airflow_eo.sinks import PostgresUpsertSink

    store = OffsetStoreHook("eo_offset_store").get_store()
    pipeline, dead_letters = f"prune_pg_{uuid.uuid4().hex[:10]}", f"prune_dl_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {dead_letters} (pipeline_id VARCHAR(190) NOT NULL, topic VARCHAR(249) NOT NULL, "
                     "kafka_partition INT NOT NULL, kafka_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, "
                     "error TEXT NOT NULL, PRIMARY KEY (pipeline_id, topic, kafka_partition, kafka_offset))")
    try:
        spec = PostgresUpsertSink(table=f"{dead_letters}_out", key_columns=["k"], dead_letter_table=dead_letters)
        epoch = store.take_pipeline(pipeline, sink=spec.record())
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            for batch_id in range(4):  # batches 0..3 committed, each with two dead letters
                run_batch(store, pipeline, epoch, 10)
                for offset in (batch_id * 10, batch_id * 10 + 1):
                    conn.execute(f"INSERT INTO {dead_letters} VALUES (%s, 't', 0, %s, %s, 'bad')",
                                 (pipeline, offset, batch_id))
        age(store, pipeline, 4, days=200)
        done = HistoryPruner(pipeline_operations("eo_offset_store"), chunk=3).prune(
            DAYS_90, pipeline_id=pipeline, apply=True, reason="retention")
        assert [(p.batches, p.dead_letters, p.notes) for p in done.pipelines] == [(3, 6, [])], done.to_dict()
        with psycopg.connect(**postgres_kwargs) as conn:
            assert conn.execute(f"SELECT batch_id FROM {dead_letters}").fetchall() == [(3,), (3,)]
    finally:
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {dead_letters}")
        with store.transaction() as cur:
            for t in ("eo_batch", "eo_offset", "eo_audit", "eo_pipeline"):
                cur.execute(f"DELETE FROM {t} WHERE pipeline_id = %s", (pipeline,))


def test_history_retention_prunes_a_bounded_share_after_each_batch(bootstrap, mysql_kwargs, topic_name, monkeypatch):
    """The operator's ``history_retention``: after each committed batch a bounded share (here one chunk of 2 rows) of
    the history older than it goes by ``prune``'s rules, audited; the batches go on where they left off, the last
    committed one is never pruned, and the tiling ``verify`` reads finds no gap. A retention under a day is refused
    when the DAG is parsed."""
    import json

    from confluent_kafka import Producer

    from airflow_eo.core.errors import ConfigurationError
    from airflow_eo.ops import history as history_ops
    from airflow_eo.sinks import MySqlUpsertSink
    from examples import page_views
    from tests.support.kafka import create_topic
    from tests.support.operator_harness import events_table, operator, run
    from tests.support.page_views import table_rows

    def produce(count: int) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for _ in range(count):
            producer.produce(topic_name, json.dumps(page_views.page_view()).encode(), partition=0)
        assert producer.flush(30) == 0

    create_topic(bootstrap, topic_name, 1)
    produce(80)
    table = events_table(mysql_kwargs)
    with pytest.raises(ConfigurationError, match="shorter than a day"):
        operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]), history_retention="2h")
    op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]), history_retention="90d")
    store = OffsetStoreHook("eo_offset_store").get_store()
    pipeline = op.pipeline_id
    try:
        epoch = store.take_pipeline(pipeline)
        for start in range(0, 50, 10):  # a year ago, batches 0..4 read offsets 0..50 (their rows are not this test's)
            batch = store.insert_batch(pipeline, epoch, f"old-{start}", [OffsetRange(topic_name, 0, start,
                                                                                     start + 10)], [])
            store.commit_batch(batch, epoch, BatchSummary.of(batch, batch.run_id, epoch))
        age(store, pipeline, 5, days=200)
        monkeypatch.setattr(history_ops, "RETENTION_CHUNK", 2)

        first = run(op)
        assert (first["batch_id"], first["ranges"][0]["from_offset"], first["records_in"]) == (5, 50, 30)
        assert sorted(b.record.batch_id for b in store.batch_history(pipeline, 100)) == [2, 3, 4, 5]
        prunes = [a for a in store.audit_log(pipeline, 100) if a.action == PRUNE_ACTION]
        assert len(prunes) == 1 and "history_retention" in prunes[0].reason, prunes
        assert len(table_rows(mysql_kwargs, table)) == 30

        produce(10)
        second = run(op)
        assert (second["batch_id"], second["ranges"][0]["from_offset"], second["records_in"]) == (6, 80, 10)
        assert sorted(b.record.batch_id for b in store.batch_history(pipeline, 100)) == [4, 5, 6]
        batches = [b.record for b in store.batch_history(pipeline, 100)]
        assert check_tiling(batches, store.committed_offsets(pipeline),
                            audited_moves(store.audit_log(pipeline, 100))) == []
        assert len(table_rows(mysql_kwargs, table)) == 40
    finally:
        with store.transaction() as cur:
            for t in ("eo_batch", "eo_offset", "eo_audit", "eo_pipeline"):
                cur.execute(f"DELETE FROM {t} WHERE pipeline_id = %s", (pipeline,))
