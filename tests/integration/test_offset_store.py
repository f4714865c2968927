"""The offset store on the real MariaDB: fencing epochs and compare-and-set at the commit point."""

from __future__ import annotations

import uuid

import pytest

from airflow_eo.core.errors import CommitConflictError, FencedError
from airflow_eo.core.protocol import BatchSummary, ExecutionResult
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.states import BatchState
from airflow_eo.mysql.store import MySqlOffsetStore


@pytest.fixture
def store(mysql_kwargs) -> MySqlOffsetStore:
    store = MySqlOffsetStore(mysql_kwargs)
    store.migrate()
    MySqlOffsetStore(mysql_kwargs).migrate()  # idempotent
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
