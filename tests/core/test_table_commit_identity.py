"""The identity a table sink's commit carries (Delta's txnAppId / txnVersion) and what recovery reads from it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import pytest

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.errors import TableMarkerError
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.recovery import committed_by_table, table_claim, table_transaction
from airflow_eo.lakehouse.adapter import TableCommitAdapter, named_failure

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def batch(batch_id: int, interval: Interval | None = None) -> BatchRecord:
    return BatchRecord("p", batch_id, f"run{batch_id}", 1, BatchState.PLANNED, [OffsetRange("t", 0, 0, 5)],
                       interval=interval)


def test_one_app_id_per_pipeline_and_one_per_interval():
    assert table_transaction("p", 7, None) == table_transaction("p", 7, None)
    assert table_transaction("p", 7, None).app_id == "airflow_eo.p"
    early, late = Interval(T0, T0 + HOUR), Interval(T0 + HOUR, T0 + 2 * HOUR)
    # An older interval backfilled after a newer one gets a lower batch id: under the newer one's app id Delta
    # would skip it as already seen; each interval has its own.
    assert table_transaction("p", 3, early).app_id != table_transaction("p", 9, late).app_id
    assert table_transaction("p", 3, early).app_id == table_transaction("p", 3, Interval(T0, T0 + HOUR)).app_id
    assert table_transaction("p", 3, early).app_id != table_transaction("q", 3, early).app_id


def test_a_batch_counts_as_committed_once_its_app_id_reached_its_version():
    early, late = Interval(T0, T0 + HOUR), Interval(T0 + HOUR, T0 + 2 * HOUR)
    unfinished = [batch(4), batch(5, early), batch(6, late)]
    versions = {table_transaction("p", 4, None).app_id: 4, table_transaction("p", 5, early).app_id: None,
                table_transaction("p", 6, late).app_id: 5}
    assert committed_by_table(unfinished, versions) == {4}
    assert committed_by_table([batch(4)], {"airflow_eo.p": 3}) == set()
    assert committed_by_table([batch(4)], {}) == set()


def test_a_table_claiming_a_batch_the_store_never_planned_is_refused_and_foreign_markers_are_ignored():
    """Any writer of a table can set its markers: one above the store's newest planned batch (the newest
    unfinished) would have the sink skip every batch up to it, offsets advancing and nothing written; a marker that
    is no batch id (another writer's property of that name) is ignored, not raised on by every attempt."""
    assert committed_by_table([batch(3), batch(4)], {"airflow_eo.p": 4}) == {3, 4}
    with pytest.raises(TableMarkerError, match=r"the table claims batch 8 of airflow_eo\.p, above the newest batch "
                                               r"the offset store planned \(4\)"):
        committed_by_table([batch(4)], {"airflow_eo.p": 8})
    late = Interval(T0 + HOUR, T0 + 2 * HOUR)
    with pytest.raises(TableMarkerError, match="claims batch 9"):
        committed_by_table([batch(4), batch(6, late)], {table_transaction("p", 6, late).app_id: 9})
    assert [table_claim(m) for m in ("7", " 12 ", 5, "x", "", "-1", "7.0", "١", True, None, "9" * 30)] == [
        7, 12, 5, None, None, None, None, None, None, None, None]


class Table(TableCommitAdapter):
    """A table whose commit fails with the given errors first; ``has`` says whether the batch is in it."""

    name, commit_backoff_s = "TableSink", 0.0

    def __init__(self, *errors: Exception, has: Sequence[bool] = ()) -> None:
        self.errors, self.has, self.commits, self.asked = list(errors), list(has), 0, 0

    @property
    def table_label(self) -> str:
        return "the table t"

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        return set()

    def commit(self) -> str:  # type: ignore[override]
        self.commits += 1
        if self.errors:
            raise self.errors.pop(0)
        return "committed"

    def committed(self) -> bool:
        self.asked += 1
        return self.has.pop(0) if self.has else False

    def run(self) -> str | None:
        return self.commit_with_retries(7, self.commit, lambda e: named_failure(e, re.compile("Conflict")),
                                        self.committed)


def test_a_conflicting_table_commit_is_retried_after_asking_the_table_and_bounded():
    table = Table(RuntimeError("Conflict: another writer"), RuntimeError("Conflict again"))
    assert table.run() == "committed" and (table.commits, table.asked) == (3, 2)
    # A conflict after which the table has the batch (a zombie's commit refused): not written again.
    table = Table(RuntimeError("Conflict: refused"), has=[True])
    assert table.run() is None and (table.commits, table.asked) == (1, 1)
    table = Table(ValueError("not a conflict"))
    with pytest.raises(ValueError):
        table.run()
    assert (table.commits, table.asked) == (1, 0)
    table = Table(*[RuntimeError(f"Conflict {n}") for n in range(Table.commit_tries)])
    with pytest.raises(RuntimeError, match=f"Conflict {Table.commit_tries - 1}"):
        table.run()
    assert table.commits == Table.commit_tries


class JavaError:
    """A py4j Java exception: its text, and its cause."""

    def __init__(self, text: str, cause: JavaError | None = None) -> None:
        self.text, self.cause = text, cause

    def toString(self) -> str:
        return self.text

    def getCause(self) -> JavaError | None:
        return self.cause


def test_a_failure_is_named_by_its_java_cause_chain_or_its_python_causes():
    wrapped = RuntimeError("Job aborted")
    wrapped._origin = JavaError("SparkException: Job aborted",  # type: ignore[attr-defined]
                                JavaError("org.apache.iceberg.exceptions.CommitFailedException: stale"))
    names = re.compile(r"CommitFailedException|ConcurrentAppendException")
    assert named_failure(wrapped, names) == "CommitFailedException"
    try:
        try:
            raise ValueError("ConcurrentAppendException: Files were added")
        except ValueError as inner:
            raise RuntimeError("the MERGE failed") from inner
    except RuntimeError as outer:
        assert named_failure(outer, names) == "ConcurrentAppendException"
    assert named_failure(RuntimeError("schema mismatch"), names) is None
