"""The offset store on the real MariaDB and the real PostgreSQL (every test runs on both): fencing epochs,
compare-and-set at the commit point, interval epochs, claims, the operations' reads, the audited rewind."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from importlib import import_module
from typing import Any

import pytest

from airflow_eo.core.batch import BatchSummary, ExecutionResult, Owner
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.errors import (
    CommitConflictError,
    FencedError,
    OperationError,
    PipelineConflictError,
    RetiredPipelineError,
    UnknownPipelineError,
)
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.rewind import PartitionChange, RewindKind, RewindPlan, RewindTarget
from airflow_eo.mysql.database import DATABASE as MYSQL
from airflow_eo.postgres.database import DATABASE as POSTGRES
from airflow_eo.sqlstore.commit_point import CAS_PARTITIONS, advance_offsets
from airflow_eo.sqlstore.store import SqlOffsetStore

STORES = {"mysql": partial(SqlOffsetStore, MYSQL), "postgres": partial(SqlOffsetStore, POSTGRES)}


@pytest.fixture(params=sorted(STORES))
def store(request) -> SqlOffsetStore:
    kwargs = request.getfixturevalue(f"{request.param}_kwargs")
    store = STORES[request.param](kwargs)
    store.migrate()
    STORES[request.param](kwargs).migrate()  # idempotent
    return store


@pytest.fixture
def pipeline() -> str:
    return f"p_{uuid.uuid4().hex[:8]}"


def test_each_take_increments_the_epoch(store, pipeline):
    assert [store.take_pipeline(pipeline) for _ in range(3)] == [1, 2, 3]


def test_a_fenced_attempt_can_neither_plan_nor_commit(store, pipeline):
    old = store.take_pipeline(pipeline)
    batch = store.insert_batch(pipeline, old, "run-1", [OffsetRange("t", 0, 0, 10)], [])
    store.take_pipeline(pipeline)  # a newer attempt
    with pytest.raises(FencedError, match="newer attempt"):
        store.commit_batch(batch, old, BatchSummary.of(batch, batch.run_id, old))
    with pytest.raises(FencedError):
        store.insert_batch(pipeline, old, "run-2", [OffsetRange("t", 0, 0, 10)], [])
    assert store.committed_offsets(pipeline) == {}
    assert store.get_batch(pipeline, batch.batch_id).state == BatchState.PLANNED


def test_a_retired_pipeline_refuses_its_takes_until_brought_back(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    batch = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange("t", 0, 0, 10)], [])
    with pytest.raises(OperationError, match=r"unfinished batches \(0 \(planned\)\).*airflow eo recover"):
        store.retire(pipeline, "ops", "gone", epoch, {})
    store.commit_batch(batch, epoch, BatchSummary.of(batch, "run-1", epoch))
    with pytest.raises(OperationError, match="was taken since this command looked"):
        store.retire(pipeline, "ops", "gone", epoch - 1, {})
    retired = store.retire(pipeline, "ops", "gone", epoch, {"consumer_group": "g"})
    assert retired == epoch + 1 and store.pipeline(pipeline).retired_at is not None
    with pytest.raises(RetiredPipelineError, match=f"retire {pipeline} --undo --apply --reason TEXT"):
        store.take_pipeline(pipeline)
    assert store.pipeline(pipeline).epoch == retired  # the refused take moved nothing
    assert store.unretire(pipeline, "ops", "back") == retired + 1
    assert store.pipeline(pipeline).retired_at is None and store.take_pipeline(pipeline) == retired + 2
    assert store.committed_offsets(pipeline) == {("t", 0): 10}  # kept throughout
    assert [(a.action, a.reason, a.epoch) for a in store.audit_log(pipeline, 5)] == [
        ("unretire", "back", retired + 1), ("retire", "gone", retired)]


def test_a_rename_moves_every_row_and_the_next_batch_continues_where_the_old_id_stopped(store, pipeline):
    new, other = f"{pipeline}_new", f"{pipeline}_other"
    epoch = store.take_pipeline(pipeline)
    batch = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange("t", 0, 0, 10)], [])
    store.commit_batch(batch, epoch, BatchSummary.of(batch, "run-1", epoch))
    store.take_pipeline(other)

    def refuse(exists: bool) -> None:
        if exists:
            raise OperationError("exists")

    with pytest.raises(OperationError, match="exists"):
        store.rename(pipeline, other, "ops", "x", epoch, refuse)

    def fails() -> None:
        raise RuntimeError("the sink's rows could not move")

    with pytest.raises(RuntimeError):
        store.rename(pipeline, new, "ops", "x", epoch, refuse, before_commit=fails)
    assert store.pipelines(new) == [] and store.committed_offsets(pipeline) == {("t", 0): 10}  # all rolled back
    assert store.rename(pipeline, new, "ops", "renamed", epoch, refuse) == epoch + 1
    assert store.pipelines(pipeline) == [] and store.committed_offsets(pipeline) == {}
    assert store.committed_offsets(new) == {("t", 0): 10}
    assert [b.record.batch_id for b in store.batch_history(new, 5)] == [0]
    assert [(a.action, a.details) for a in store.audit_log(new, 5)] == [("rename", {"from": pipeline, "to": new})]
    with pytest.raises(FencedError):  # the old id's attempts are fenced: their rows are gone
        store.insert_batch(pipeline, epoch, "run-2", [OffsetRange("t", 0, 10, 20)], [])
    taken = store.take_pipeline(new)
    assert store.insert_batch(new, taken, "run-2", [OffsetRange("t", 0, 10, 20)], []).batch_id == 1


def test_commit_moves_offsets_and_batch_state_together(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 0)]
    batch = store.insert_batch(pipeline, epoch, "run-1", ranges, [])
    summary = BatchSummary.of(batch, "run-1", epoch, ExecutionResult(records_in=10, seconds={"execute": 1.5}))
    store.commit_batch(batch, epoch, summary)
    assert store.committed_offsets(pipeline) == {("t", 0): 10, ("t", 1): 0}
    record = store.get_batch(pipeline, batch.batch_id)
    assert record.state == BatchState.COMMITTED and record.summary == summary
    assert record.summary.records_in == 10 and record.summary.to_dict()["seconds"] == {"execute": 1.5}
    with pytest.raises(CommitConflictError):
        store.commit_batch(batch, epoch, BatchSummary.of(batch, batch.run_id, epoch))  # not twice


def test_cas_conflict_commits_nothing_of_the_losing_batch(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    first = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 5)], [])
    store.commit_batch(first, epoch, BatchSummary.of(first, first.run_id, epoch))
    # A batch planned from stale offsets: partition 1 matches, partition 0 does not.
    stale = store.insert_batch(pipeline, epoch, "run-2", [OffsetRange("t", 1, 5, 8), OffsetRange("t", 0, 3, 12)], [])
    with pytest.raises(CommitConflictError, match=r"t\[0\] is committed at offset 10"):
        store.commit_batch(stale, epoch, BatchSummary.of(stale, stale.run_id, epoch))
    assert store.committed_offsets(pipeline) == {("t", 0): 10, ("t", 1): 5}  # partition 1 rolled back too
    assert store.get_batch(pipeline, stale.batch_id).state == BatchState.PLANNED


def test_a_batch_over_more_partitions_than_a_statement_takes_commits_each_and_refuses_a_moved_one(store, pipeline):
    """The commit point moves partitions a statement per CAS_PARTITIONS: across statements, a first batch inserts
    every row, the next moves every one, a new partition among moved ones gets its row, and a stale partition in
    the last statement refuses the whole batch (the rows the earlier statements moved are rolled back too)."""
    width = 2 * CAS_PARTITIONS + 3
    epoch = store.take_pipeline(pipeline)

    def commit(run: str, ranges: list[OffsetRange]) -> None:
        batch = store.insert_batch(pipeline, epoch, run, ranges, [])
        store.commit_batch(batch, epoch, BatchSummary.of(batch, run, epoch))

    commit("run-1", [OffsetRange("t", p, 0, p % 7) for p in range(width)])
    assert store.committed_offsets(pipeline) == {("t", p): p % 7 for p in range(width)}
    commit("run-2", [OffsetRange("t", p, p % 7, 10) for p in range(width)] + [OffsetRange("t", width, 0, 3)])
    moved = {("t", p): 10 for p in range(width)} | {("t", width): 3}
    assert store.committed_offsets(pipeline) == moved
    stale = [OffsetRange("t", p, 10, 20) for p in range(width)] + [OffsetRange("t", width, 2, 5)]
    batch = store.insert_batch(pipeline, epoch, "run-3", stale, [])
    with pytest.raises(CommitConflictError, match=rf"t\[{width}\] is committed at offset 3, but batch "
                                                  rf"{batch.batch_id} starts at 2"):
        store.commit_batch(batch, epoch, BatchSummary.of(batch, "run-3", epoch))
    assert store.committed_offsets(pipeline) == moved
    assert store.get_batch(pipeline, batch.batch_id).state == BatchState.PLANNED


@pytest.mark.parametrize("kind", sorted(STORES))
@pytest.mark.parametrize(("others", "their_partitions", "width"), [(3, 3, 25), (1, 1, 2)])
def test_the_commit_locks_only_its_own_rows_and_names_the_first_partition_elsewhere(kind, others, their_partitions,
                                                                                   width, request):
    """The offsets move by the primary key: another pipeline's rows (and this one's partitions outside the batch) stay
    free while the commit's transaction is open. On a small store (a database of its own) MariaDB planned a row IN
    list of 48 partitions among 59 rows as a scan of the index, which at REPEATABLE READ locked every row it read;
    the smallest shape (2 partitions among 5 rows) is where a scan is cheapest. Topics that differ only in case move
    apart, and of two partitions elsewhere the first in the batch's order (insert_batch sorts them) is named."""
    kwargs, drop = _fresh_database(kind, request.getfixturevalue(f"{kind}_kwargs"))
    request.addfinalizer(drop)
    store = STORES[kind](kwargs)
    store.migrate()
    request.addfinalizer(store.close)
    other_ids = [f"other_{i}" for i in range(others)]
    for other in other_ids:
        epoch = store.take_pipeline(other)
        batch = store.insert_batch(other, epoch, "run-1",
                                   [OffsetRange("t", p, 0, 5) for p in range(their_partitions)], [])
        store.commit_batch(batch, epoch, BatchSummary.of(batch, "run-1", epoch))
    pipeline = "wide"
    epoch = store.take_pipeline(pipeline)
    first = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange(t, p, 0, 5) for t in ("t", "T")
                                                          for p in range(width)], [])
    store.commit_batch(first, epoch, BatchSummary.of(first, "run-1", epoch))
    moving = width - 1  # the last partition of each topic stays out of the batch
    ranges = [OffsetRange("t", p, 5, 9) for p in range(moving)] + [OffsetRange("T", p, 5, 7) for p in range(moving)]
    batch = store.insert_batch(pipeline, epoch, "run-2", ranges, [])
    lock = ("SELECT next_offset FROM eo_offset WHERE pipeline_id = %s AND topic = %s AND kafka_partition = %s "
            f"{store.dialect.exclusive_lock} NOWAIT")
    with store.transaction() as cur:
        advance_offsets(cur, store.dialect, batch)
        with store.transaction() as other_cur:
            for other in other_ids:
                for p in range(their_partitions):
                    other_cur.execute(lock, (other, "t", p))
                    assert other_cur.fetchone()["next_offset"] == 5
            other_cur.execute(lock, (pipeline, "T", moving))  # this pipeline's, outside the batch
            assert other_cur.fetchone()["next_offset"] == 5
        with store.transaction() as other_cur, pytest.raises(Exception, match="(?i)lock"):
            other_cur.execute(lock, (pipeline, "T", 0))  # the test can see a lock
        if kind == "mysql":
            time.sleep(0.2)  # InnoDB refreshes INNODB_TRX at most every 0.1 s
            cur.execute("SELECT trx_rows_locked FROM information_schema.INNODB_TRX "
                        "WHERE trx_mysql_thread_id = CONNECTION_ID()")
            assert cur.fetchone()["trx_rows_locked"] == len(ranges)
    assert store.committed_offsets(pipeline) == ({("t", p): 9 for p in range(moving)}
                                                 | {("T", p): 7 for p in range(moving)}
                                                 | {("t", moving): 5, ("T", moving): 5})
    stale = store.insert_batch(pipeline, epoch, "run-3", [OffsetRange("t", 0, 9, 10), OffsetRange("T", 0, 5, 8),
                                                          OffsetRange("t", moving, 3, 8)], [])
    with pytest.raises(CommitConflictError, match=r"T\[0\] is committed at offset 7, but batch \d+ starts at 5"):
        store.commit_batch(stale, epoch, BatchSummary.of(stale, "run-3", epoch))


def test_a_second_commit_of_a_committed_batch_is_refused_by_its_offsets_too(store, pipeline):
    """A row already at the batch's end before the update (an empty partition's compare-and-set matches it again)
    is not one the update moved: the offsets refuse the second commit before the batch's state does."""
    epoch = store.take_pipeline(pipeline)
    batch = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 0),
                                                          OffsetRange("t", 2, 0, 0)], [])
    store.commit_batch(batch, epoch, BatchSummary.of(batch, "run-1", epoch))
    with store.transaction() as cur, pytest.raises(CommitConflictError, match=rf"1 of the partitions of batch "
                                                                            rf"{batch.batch_id} .* already at its end"):
        advance_offsets(cur, store.dialect, batch)
    assert store.committed_offsets(pipeline) == {("t", 0): 10, ("t", 1): 0, ("t", 2): 0}


def test_a_batch_that_names_a_partition_twice_is_refused_when_planned_and_at_its_commit(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    twice = [OffsetRange("t", 0, 0, 4), OffsetRange("t", 0, 4, 6)]
    with pytest.raises(ValueError, match=r"t\[0\] is named twice"):
        store.insert_batch(pipeline, epoch, "run-1", twice, [])
    assert store.batch_for_run(pipeline, "run-1") is None
    batch = store.insert_batch(pipeline, epoch, "run-1", twice[:1], [])
    with store.transaction() as cur, pytest.raises(ValueError, match=r"names t\[0\] twice"):
        advance_offsets(cur, store.dialect, dataclasses.replace(batch, ranges=twice))
    assert store.committed_offsets(pipeline) == {}


def test_first_commit_of_a_new_partition_conflicts_with_a_concurrent_one(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    a = store.insert_batch(pipeline, epoch, "run-a", [OffsetRange("t", 0, 0, 4)], [])
    b = store.insert_batch(pipeline, epoch, "run-b", [OffsetRange("t", 0, 0, 6)], [])
    store.commit_batch(a, epoch, BatchSummary.of(a, a.run_id, epoch))
    with pytest.raises(CommitConflictError):
        store.commit_batch(b, epoch, BatchSummary.of(b, b.run_id, epoch))
    assert store.committed_offsets(pipeline) == {("t", 0): 4}


def test_abort_frees_the_run_and_a_retry_adopts_its_batch(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    batch = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange("t", 0, 0, 4)], [])
    newer = store.take_pipeline(pipeline)
    adopted = store.adopt_batch(batch, newer)
    assert adopted.epoch == newer and adopted.ranges == batch.ranges
    store.abort_batch(adopted, newer)
    assert store.batch_for_run(pipeline, "run-1") is None  # run-1 may plan a fresh batch
    assert store.unfinished_batches(pipeline) == []


def test_concurrent_takes_each_get_their_own_epoch(store, pipeline):
    store.take_pipeline(pipeline)  # the row exists: the takes below race on its lock, not on its creation
    epochs: list[int] = []
    threads = [threading.Thread(target=lambda: epochs.append(store.take_pipeline(pipeline))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(epochs) == list(range(2, 10))


def test_a_second_owner_or_another_mode_is_refused_and_the_sink_is_recorded(store, pipeline):
    sink = SinkRecord(kind="MySqlXaSink", accumulating=True, conn_id="c", target="db.t", dead_letter_table="dl",
                      options={"table": "db.t"})
    store.take_pipeline(pipeline, owner=Owner("a", "b.c"), sink=sink)
    # DAG "a.b" task "c": the same "a.b.c" as text (and the same default pipeline id), another task.
    with pytest.raises(PipelineConflictError, match="belongs to DAG 'a' task 'b.c', and DAG 'a.b' task 'c'"):
        store.take_pipeline(pipeline, owner=Owner("a.b", "c"))
    with pytest.raises(PipelineConflictError, match="ran in continuous mode"):
        store.take_interval(pipeline, Interval(datetime(2026, 1, 1, tzinfo=timezone.utc),
                                               datetime(2026, 1, 2, tzinfo=timezone.utc)), owner=Owner("a", "b.c"))
    info = store.pipeline(pipeline)
    assert (info.epoch, info.owner, info.owned_by, info.sink) == (1, "a.b.c", Owner("a", "b.c"), sink)
    assert info.taken_at is not None and abs((datetime.now(timezone.utc) - info.taken_at).total_seconds()) < 60


def test_interval_epochs_fence_per_interval_and_a_replay_keeps_the_batch_committed(store, pipeline):
    h = [datetime(2026, 3, 1, hour, tzinfo=timezone.utc) for hour in range(3)]
    first, second = Interval(h[0], h[1]), Interval(h[1], h[2])
    e1 = store.take_interval(pipeline, first)
    e2 = store.take_interval(pipeline, second)
    assert (e1, e2, store.take_interval(pipeline, first)) == (1, 1, 2)  # a take of one interval fences only it
    with pytest.raises(FencedError, match="interval"):
        store.insert_batch(pipeline, e1, "run-1", [OffsetRange("t", 0, 0, 5)], [], interval=first)
    batch = store.insert_batch(pipeline, e2, "run-2", [OffsetRange("t", 0, 5, 9)], [], interval=second)
    store.commit_batch(batch, e2, BatchSummary.of(batch, "run-2", e2))
    found = store.batch_for_interval(pipeline, second)
    assert found is not None and found.state == BatchState.COMMITTED and found.interval == second
    assert store.committed_offsets(pipeline) == {}  # interval batches have no running position
    e3 = store.take_interval(pipeline, second)
    store.record_replay(found, e3, BatchSummary.of(found, "run-2-cleared", e3))
    replayed = store.get_batch(pipeline, batch.batch_id)
    assert replayed.state == BatchState.COMMITTED and replayed.summary.run_id == "run-2-cleared"


def test_the_operations_reads_see_pipelines_offsets_batches_and_the_audit_log(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    batches = []
    for n, (start, end) in enumerate([(0, 4), (4, 9)]):
        batch = store.insert_batch(pipeline, epoch, f"run-{n}", [OffsetRange("t", 0, start, end)], [])
        store.commit_batch(batch, epoch, BatchSummary.of(batch, batch.run_id, epoch))
        batches.append(batch)
    store.insert_batch(pipeline, epoch, "run-2", [OffsetRange("t", 0, 9, 12)], [])  # unfinished
    assert [p.pipeline_id for p in store.pipelines(pipeline)] == [pipeline]
    assert store.all_committed_offsets()[pipeline] == {("t", 0): 9}
    assert store.latest_committed_batch_id(pipeline) == 1
    newest = store.latest_batches()[pipeline]
    assert (newest.record.batch_id, newest.record.state) == (2, BatchState.PLANNED)
    history = store.batch_history(pipeline, limit=10)
    assert [(b.record.batch_id, b.record.state) for b in history] == [
        (2, BatchState.PLANNED), (1, BatchState.COMMITTED), (0, BatchState.COMMITTED)]
    assert history[1].committed_at is not None and history[1].committed_at.tzinfo is not None
    assert [b.record.batch_id for b in store.batch_history(pipeline, limit=10, batch_ids=[0])] == [0]
    taken = store.take_audited(pipeline, "tester", "recover", "a reason", {"branches": ["x"], "completed": False})
    assert taken == epoch + 1 and store.pipeline(pipeline).epoch == taken  # the take and the row, together
    [entry] = store.audit_log(pipeline, limit=5)
    assert (entry.actor, entry.action, entry.reason, entry.epoch, entry.details) == (
        "tester", "recover", "a reason", taken, {"branches": ["x"], "completed": False})
    store.complete_audit(pipeline, taken, "recover", {"branches": ["x"], "completed": True})
    [entry] = store.audit_log(pipeline, limit=5)
    assert entry.details == {"branches": ["x"], "completed": True}
    with pytest.raises(UnknownPipelineError):
        store.take_audited(pipeline + "_nope", "tester", "recover", "a reason", {})
    with pytest.raises(UnknownPipelineError, match="its pipelines are: ") as unknown:
        store.pipeline(pipeline + "_nope")
    # The first 20 by id are named (a reused stack's store holds many): this one, or a count of the rest.
    assert pipeline in str(unknown.value) or str(unknown.value).endswith(" more")


def test_a_rewind_moves_offsets_takes_the_epoch_and_is_audited_or_changes_nothing(store, pipeline):
    epoch = store.take_pipeline(pipeline)
    batch = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange("t", 0, 0, 10)], [])
    store.commit_batch(batch, epoch, BatchSummary.of(batch, "run-1", epoch))
    target = RewindTarget(RewindKind.EARLIEST)
    stale = RewindPlan(pipeline, target, (PartitionChange("t", 0, old=7, new=0),))
    with pytest.raises(OperationError, match="moved since the rewind was planned"):
        store.rewind(stale, "tester", "why", lambda info, unfinished: None)
    assert store.committed_offsets(pipeline) == {("t", 0): 10} and store.audit_log(pipeline, 5) == []
    plan = RewindPlan(pipeline, target, (PartitionChange("t", 0, old=10, new=3),
                                         PartitionChange("t", 1, old=None, new=2)))
    seen = []
    taken = store.rewind(plan, "tester", "replay", lambda info, unfinished: seen.append((info.epoch, unfinished)),
                         overrides=["--an-override"])
    assert taken == epoch + 1 and seen == [(epoch, [])]
    assert store.committed_offsets(pipeline) == {("t", 0): 3, ("t", 1): 2}
    with pytest.raises(FencedError):  # the running attempt is fenced
        store.insert_batch(pipeline, epoch, "run-2", [OffsetRange("t", 0, 3, 5)], [])
    [entry] = store.audit_log(pipeline, 5)
    assert (entry.action, entry.reason, entry.epoch) == ("rewind", "replay", taken)
    assert entry.details["overrides"] == ["--an-override"]


def test_ids_and_topics_that_differ_only_in_case_never_share_state(store, pipeline):
    """MariaDB's default collation (latin1_swedish_ci on the stack) had 'Orders' = 'orders'."""
    upper = pipeline.upper()  # p_3fa9.. and P_3FA9..
    assert [store.take_pipeline(pipeline), store.take_pipeline(upper)] == [1, 1]
    batch = store.insert_batch(pipeline, 1, "run-1", [OffsetRange("Orders", 0, 0, 5), OffsetRange("orders", 0, 0, 7)],
                               [])
    store.commit_batch(batch, 1, BatchSummary.of(batch, "run-1", 1))
    other = store.insert_batch(upper, 1, "run-1", [OffsetRange("Orders", 0, 0, 3)], [])
    store.commit_batch(other, 1, BatchSummary.of(other, "run-1", 1))
    assert store.committed_offsets(pipeline) == {("Orders", 0): 5, ("orders", 0): 7}
    assert store.committed_offsets(upper) == {("Orders", 0): 3}
    assert [p.pipeline_id for p in store.pipelines(upper)] == [upper]
    assert [b.record.batch_id for b in store.batch_history(upper, 10)] == [0]


def _fresh_database(kind: str, kwargs: dict) -> tuple[dict, Callable[[], None]]:
    """An empty database on the stack's server (connection arguments, and how to drop it)."""
    name = f"eo_upgrade_{uuid.uuid4().hex[:8]}"
    if kind == "mysql":
        import pymysql

        def run(sql: str) -> None:
            conn = pymysql.connect(**kwargs, autocommit=True)
            try:
                conn.cursor().execute(sql)
            finally:
                conn.close()

        run(f"CREATE DATABASE {name}")
        return {**kwargs, "database": name}, lambda: run(f"DROP DATABASE {name}")
    import psycopg

    def run_pg(sql: str) -> None:
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            conn.execute(sql)

    run_pg(f"CREATE DATABASE {name}")
    # FORCE: the store keeps idle connections to it (sqlstore/connections.py)
    return {**kwargs, "dbname": name}, lambda: run_pg(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_store_of_the_previous_version_upgrades_and_its_owners_are_adopted(kind, request, monkeypatch):
    migrations = import_module(f"airflow_eo.{kind}.migrations")
    kwargs, drop = _fresh_database(kind, request.getfixturevalue(f"{kind}_kwargs"))
    request.addfinalizer(drop)
    latest = migrations.MIGRATIONS
    monkeypatch.setattr(migrations, "MIGRATIONS", latest[:-1])  # the previous version
    old = STORES[kind](kwargs)
    old.migrate()
    with old.transaction() as cur:  # a pipeline as the previous version recorded it: its owner's text only
        cur.execute("INSERT INTO eo_pipeline (pipeline_id, epoch, owner, mode) VALUES ('legacy', 1, 'a.b.c', "
                    "'continuous')")
    monkeypatch.setattr(migrations, "MIGRATIONS", latest)
    store = STORES[kind](kwargs)
    store.migrate()
    with store.transaction() as cur:  # an upgrade interrupted after its DDL runs again: each statement is idempotent
        cur.execute("DELETE FROM eo_schema_version WHERE version = %s", (latest[-1][0],))
    STORES[kind](kwargs).migrate()
    with store.transaction() as cur:
        cur.execute("SELECT version FROM eo_schema_version ORDER BY version")
        assert [r["version"] for r in cur.fetchall()] == [v for v, _ in latest]
        if kind == "mysql":
            cur.execute("SELECT DISTINCT collation_name FROM information_schema.columns WHERE table_schema = %s "
                        "AND column_name IN ('pipeline_id', 'topic', 'owner_dag_id', 'owner_task_id')",
                        (kwargs["database"],))
            assert [r["collation_name"] for r in cur.fetchall()] == ["utf8mb4_bin"]
    assert store.pipeline("legacy").owned_by is None  # ids unknown until its owner's next take
    assert store.take_pipeline("legacy", owner=Owner("a", "b.c")) == 2  # the text matches: adopted
    assert store.pipeline("legacy").owned_by == Owner("a", "b.c")
    with pytest.raises(PipelineConflictError, match="belongs to DAG 'a' task 'b.c'"):
        store.take_pipeline("legacy", owner=Owner("a.b", "c"))


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_read_only_store_never_migrates_and_refuses_a_schema_behind_clearly(kind, request, monkeypatch):
    """The UI's reads (issue 23, item 7): a store nothing migrated yet, or one a version behind, is left as it is."""
    migrations = import_module(f"airflow_eo.{kind}.migrations")
    kwargs, drop = _fresh_database(kind, request.getfixturevalue(f"{kind}_kwargs"))
    request.addfinalizer(drop)

    def tables() -> list[str]:
        with STORES[kind](kwargs).transaction() as cur:
            cur.execute("SELECT table_name AS name FROM information_schema.tables WHERE table_name LIKE 'eo%%'"
                        + (" AND table_schema = DATABASE()" if kind == "mysql" else ""))
            return sorted(r["name"] for r in cur.fetchall())

    reader = STORES[kind](kwargs)
    reader.read_only = True
    with pytest.raises(OperationError, match="version 0.*only reads"):
        reader.pipelines()
    assert tables() == []  # nothing created
    latest = migrations.MIGRATIONS
    monkeypatch.setattr(migrations, "MIGRATIONS", latest[:-1])
    STORES[kind](kwargs).migrate()  # the previous version
    monkeypatch.setattr(migrations, "MIGRATIONS", latest)
    created = tables()
    reader = STORES[kind](kwargs)
    reader.read_only = True
    with pytest.raises(OperationError, match=f"version {latest[-2][0]}, this airflow_eo needs {latest[-1][0]}"):
        reader.pipelines()
    with STORES[kind](kwargs).transaction() as cur:
        cur.execute("SELECT MAX(version) AS v FROM eo_schema_version")
        assert cur.fetchone()["v"] == latest[-2][0]  # not upgraded by the read
    assert tables() == created
    STORES[kind](kwargs).migrate()
    reader = STORES[kind](kwargs)
    reader.read_only = True
    assert reader.pipelines() == []


# The first release's version 1 of each room's migrations, as it was written before the tables were written once
# (airflow_eo/sqlstore/schema.py): a store made by it climbs the later versions.
FIRST_RELEASE = {
    "mysql": [
        """CREATE TABLE IF NOT EXISTS eo_pipeline (
            pipeline_id VARCHAR(190) NOT NULL PRIMARY KEY,
            epoch BIGINT NOT NULL,
            created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            taken_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        ) ENGINE=InnoDB""",
        """CREATE TABLE IF NOT EXISTS eo_batch (
            pipeline_id VARCHAR(190) NOT NULL,
            batch_id BIGINT NOT NULL,
            run_id VARCHAR(250) NOT NULL,
            run_key VARCHAR(250) NULL,
            interval_start TIMESTAMP(3) NULL,
            interval_end TIMESTAMP(3) NULL,
            epoch BIGINT NOT NULL,
            state VARCHAR(16) NOT NULL,
            ranges JSON NOT NULL,
            skipped JSON NULL,
            xids JSON NULL,
            records_in BIGINT NULL,
            rows_out BIGINT NULL,
            dead_letters BIGINT NULL,
            summary JSON NULL,
            created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            committed_at TIMESTAMP(3) NULL,
            PRIMARY KEY (pipeline_id, batch_id),
            UNIQUE KEY eo_batch_run (pipeline_id, run_key),
            UNIQUE KEY eo_batch_interval (pipeline_id, interval_start, interval_end),
            KEY eo_batch_state (pipeline_id, state)
        ) ENGINE=InnoDB""",
        """CREATE TABLE IF NOT EXISTS eo_offset (
            pipeline_id VARCHAR(190) NOT NULL,
            topic VARCHAR(249) NOT NULL,
            kafka_partition INT NOT NULL,
            next_offset BIGINT NOT NULL,
            batch_id BIGINT NOT NULL,
            PRIMARY KEY (pipeline_id, topic, kafka_partition)
        ) ENGINE=InnoDB""",
    ],
    "postgres": [
        """CREATE TABLE IF NOT EXISTS eo_pipeline (
            pipeline_id VARCHAR(190) NOT NULL PRIMARY KEY,
            epoch BIGINT NOT NULL,
            created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            taken_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            owner VARCHAR(250) NULL,
            mode VARCHAR(16) NULL,
            sink_kind VARCHAR(64) NULL,
            sink_accumulating BOOLEAN NULL,
            dead_letter_table VARCHAR(130) NULL,
            sink JSONB NULL
        )""",
        # Interval bounds are naive UTC (TIMESTAMP without time zone), as MySQL's DATETIME columns.
        """CREATE TABLE IF NOT EXISTS eo_batch (
            pipeline_id VARCHAR(190) NOT NULL,
            batch_id BIGINT NOT NULL,
            run_id VARCHAR(250) NOT NULL,
            run_key VARCHAR(250) NULL,
            interval_start TIMESTAMP(3) NULL,
            interval_end TIMESTAMP(3) NULL,
            epoch BIGINT NOT NULL,
            state VARCHAR(16) NOT NULL,
            ranges JSONB NOT NULL,
            skipped JSONB NULL,
            xids JSONB NULL,
            records_in BIGINT NULL,
            rows_out BIGINT NULL,
            dead_letters BIGINT NULL,
            summary JSONB NULL,
            created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            updated_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            committed_at TIMESTAMPTZ(3) NULL,
            PRIMARY KEY (pipeline_id, batch_id),
            CONSTRAINT eo_batch_run UNIQUE (pipeline_id, run_key),
            CONSTRAINT eo_batch_interval UNIQUE (pipeline_id, interval_start, interval_end)
        )""",
        "CREATE INDEX IF NOT EXISTS eo_batch_state ON eo_batch (pipeline_id, state)",
        """CREATE TABLE IF NOT EXISTS eo_offset (
            pipeline_id VARCHAR(190) NOT NULL,
            topic VARCHAR(249) NOT NULL,
            kafka_partition INT NOT NULL,
            next_offset BIGINT NOT NULL,
            batch_id BIGINT NOT NULL,
            PRIMARY KEY (pipeline_id, topic, kafka_partition)
        )""",
        """CREATE TABLE IF NOT EXISTS eo_interval (
            pipeline_id VARCHAR(190) NOT NULL,
            interval_start TIMESTAMP(3) NOT NULL,
            interval_end TIMESTAMP(3) NOT NULL,
            epoch BIGINT NOT NULL,
            taken_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            PRIMARY KEY (pipeline_id, interval_start, interval_end)
        )""",
        """CREATE TABLE IF NOT EXISTS eo_audit (
            audit_id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            pipeline_id VARCHAR(190) NOT NULL,
            created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            actor VARCHAR(250) NOT NULL,
            action VARCHAR(32) NOT NULL,
            reason TEXT NULL,
            epoch BIGINT NULL,
            details JSONB NULL
        )""",
        "CREATE INDEX IF NOT EXISTS eo_audit_pipeline ON eo_audit (pipeline_id, audit_id)",
    ],
}


def _columns(kind: str, kwargs: dict) -> list[tuple]:
    """The store's tables as the database describes them: columns (type, precision, nullability, default), keys and
    indexes, and (MySQL) the collation."""
    where = "table_schema = DATABASE()" if kind == "mysql" else "table_schema = 'public'"
    with STORES[kind](kwargs).transaction() as cur:
        cur.execute("SELECT table_name AS t, column_name AS c, data_type AS d, datetime_precision AS p, "
                    "character_maximum_length AS n, is_nullable AS nul, column_default AS dflt"
                    + (", collation_name AS coll" if kind == "mysql" else "")
                    + f" FROM information_schema.columns WHERE {where} AND table_name LIKE 'eo%%' "
                    "ORDER BY table_name, column_name")
        found: list[tuple] = [tuple(str(v).lower() for v in row.values()) for row in cur.fetchall()]
        if kind == "mysql":
            cur.execute("SELECT table_name AS t, index_name AS i, non_unique AS u, column_name AS c, seq_in_index AS s "
                        "FROM information_schema.statistics WHERE table_schema = DATABASE() ORDER BY 1, 2, 5")
        else:
            cur.execute("SELECT tablename AS t, indexname AS i, indexdef AS d FROM pg_indexes "
                        "WHERE schemaname = 'public' ORDER BY 1, 2")
        found += [tuple(str(v).lower() for v in row.values()) for row in cur.fetchall()]
    return found


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_new_store_has_the_tables_of_one_made_by_the_first_release_and_upgraded(kind, request, monkeypatch):
    """The tables are written once for every database; a store the first release made climbs its database's own
    versions. Both end with the same columns, types, defaults, keys and indexes."""
    migrations = import_module(f"airflow_eo.{kind}.migrations")
    new, drop_new = _fresh_database(kind, request.getfixturevalue(f"{kind}_kwargs"))
    request.addfinalizer(drop_new)
    old, drop_old = _fresh_database(kind, request.getfixturevalue(f"{kind}_kwargs"))
    request.addfinalizer(drop_old)
    latest = migrations.MIGRATIONS
    monkeypatch.setattr(migrations, "MIGRATIONS", [(1, FIRST_RELEASE[kind])])
    STORES[kind](old).migrate()
    monkeypatch.setattr(migrations, "MIGRATIONS", latest)
    STORES[kind](old).migrate()
    STORES[kind](new).migrate()
    upgraded, created = _columns(kind, old), _columns(kind, new)
    assert len(created) > 60
    # The columns that differ, and why (both harmless): on MySQL the first release made its tables in the server's
    # default character set, and version 4's CONVERT TO utf8mb4 widened TEXT to MEDIUMTEXT to keep its bytes;
    # version 6 made eo_store_identity in the server's default collation (it holds hex digits). A new store is
    # utf8mb4_bin throughout.
    differing = {(table, column) for table, column, *_ in set(created) ^ set(upgraded)}
    assert differing == ({("eo_audit", "reason"), ("eo_store_identity", "identity")} if kind == "mysql" else set())
    for store in (STORES[kind](old), STORES[kind](new)):
        assert len(store.store_identity()) >= 32


def _in_a_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``call`` started in a daemon thread; the list gets its result, or the exception it raised (which a thread
    would otherwise only print)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_current_store_is_taken_without_the_migration_lock_and_one_behind_waits_for_it(kind, request,
                                                                                         monkeypatch):
    """Every task makes a new store object: on a current schema its take must not queue behind the migration lock
    (one task holding it would hold up every other); a schema behind still migrates under the lock."""
    migrations = import_module(f"airflow_eo.{kind}.migrations")
    kwargs, drop = _fresh_database(kind, request.getfixturevalue(f"{kind}_kwargs"))
    request.addfinalizer(drop)
    STORES[kind](kwargs).migrate()
    holder = STORES[kind](kwargs)
    with holder.transaction() as cur:  # another task's migration holds the lock meanwhile
        holder.database.lock_migrations(cur)
        current, taken = _in_a_thread(lambda: STORES[kind](kwargs).take_pipeline("p"))
        current.join(timeout=20)
        assert taken == [1], "a take on a current schema waited for the migration lock" if not taken else taken

        latest = migrations.MIGRATIONS
        with STORES[kind](kwargs).transaction() as other:  # the schema one version behind
            other.execute("DELETE FROM eo_schema_version WHERE version = %s", (latest[-1][0],))
        behind = threading.Thread(target=STORES[kind](kwargs).migrate, daemon=True)
        behind.start()
        behind.join(timeout=1.5)
        assert behind.is_alive(), "a schema behind migrated without waiting for the migration lock"
        holder.database.unlock_migrations(cur)
    behind.join(timeout=20)
    assert not behind.is_alive()
    with holder.transaction() as cur:
        cur.execute("SELECT version FROM eo_schema_version ORDER BY version")
        assert [r["version"] for r in cur.fetchall()] == [v for v, _ in latest]


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_migrator_that_waited_for_the_lock_while_another_committed_the_same_version_does_not_fail(kind, request):
    """MySQL's migration lock is released before the migrating transaction commits: a migrator that waited for it
    may not see the version row yet, apply the version's idempotent statements again, and write the row again."""
    migrations = import_module(f"airflow_eo.{kind}.migrations")
    kwargs, drop = _fresh_database(kind, request.getfixturevalue(f"{kind}_kwargs"))
    request.addfinalizer(drop)
    STORES[kind](kwargs).migrate()
    latest = migrations.MIGRATIONS[-1][0]
    holder = STORES[kind](kwargs)
    with holder.transaction() as cur:
        cur.execute("DELETE FROM eo_schema_version WHERE version = %s", (latest,))
    with holder.transaction() as cur:  # a migrator holding the lock, its version row written, not yet committed
        holder.database.lock_migrations(cur)
        cur.execute("INSERT INTO eo_schema_version (version) VALUES (%s)", (latest,))
        waiting, outcome = _in_a_thread(STORES[kind](kwargs).migrate)
        time.sleep(1)  # the other migrator waits for the lock
        holder.database.unlock_migrations(cur)
        time.sleep(1)  # MySQL: it has the lock now, reads no row for the version, and applies it again
    waiting.join(timeout=30)
    assert not waiting.is_alive() and outcome == [None]
    with holder.transaction() as cur:
        cur.execute("SELECT version FROM eo_schema_version ORDER BY version")
        assert [r["version"] for r in cur.fetchall()] == [v for v, _ in migrations.MIGRATIONS]
