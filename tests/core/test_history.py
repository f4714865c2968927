"""``airflow eo prune``'s decisions (airflow_eo/core/history.py) and the pruner over an in-memory store
(airflow_eo/ops/history.py), and what verify's tiling makes of a pruned history."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode
from airflow_eo.core.errors import OperationError
from airflow_eo.core.history import (
    PRUNE_ACTION,
    PruneBounds,
    audit_cutoff,
    check_retention,
    positions_left,
    prunable,
    prune_below,
)
from airflow_eo.core.pipeline_status import AuditEntry, PipelineInfo
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.verify import TaskRun, audited_moves, check_runs, check_tiling, runs_the_history_answers_for
from airflow_eo.ops.history import HistoryPruner

NOW = datetime(2026, 11, 28, tzinfo=timezone.utc)
OLD = NOW - timedelta(days=200)
C, A, P = BatchState.COMMITTED, BatchState.ABORTED, BatchState.PREPARED


def batch(batch_id: int, state: BatchState = C, spans: dict[int, tuple[int, int]] | None = None) -> BatchRecord:
    spans = spans if spans is not None else {0: (batch_id * 10, batch_id * 10 + 10)}
    return BatchRecord("p", batch_id, f"run-{batch_id}", 1, state, [OffsetRange("t", k, a, b)
                                                                    for k, (a, b) in spans.items()])


def test_prune_keeps_the_last_committed_batch_and_everything_from_the_oldest_unfinished_one():
    assert prune_below(PruneBounds(Mode.CONTINUOUS, 9, None)) == (9, None)
    assert prune_below(PruneBounds(Mode.CONTINUOUS, 9, 4)) == (4, None)
    below, why = prune_below(PruneBounds(Mode.CONTINUOUS, None, None))
    assert below is None and why == "no committed batch yet"
    below, why = prune_below(PruneBounds(Mode.INTERVAL, 9, None))
    assert below is None and why is not None and "interval" in why


def test_only_old_committed_or_aborted_batches_below_the_bound_and_named_by_no_branch_go():
    batches = [batch(0), batch(1, A), batch(2, P), batch(3), batch(4), batch(5)]
    written = {b.batch_id: OLD for b in batches} | {4: NOW - timedelta(hours=1)}
    # 2 is prepared (and below the bound only in this test), 3 is named by an in-doubt branch, 4 is recent,
    # 5 is at the bound (the last committed one)
    assert prunable(batches, written, 5, NOW - timedelta(days=90), in_doubt={3}) == [0, 1]
    assert prunable(batches, {**written, 0: None}, 5, NOW - timedelta(days=90)) == [1, 3]


def test_positions_left_follow_committed_batches_in_order_and_continue_the_previous_prune():
    batches = [batch(2, spans={0: (20, 30)}), batch(1, spans={0: (10, 20), 1: (0, 5)}),
               batch(3, A, spans={0: (30, 99)})]
    assert positions_left(batches, {("t", 2): 7}) == {("t", 0): 30, ("t", 1): 5, ("t", 2): 7}


def test_retention_shorter_than_a_day_is_refused_and_audit_before_a_kept_batch_is_kept():
    with pytest.raises(OperationError, match="shorter than a day"):
        check_retention(3600)
    check_retention(90 * 86400)
    cutoff = NOW - timedelta(days=90)
    assert audit_cutoff(cutoff, None) == cutoff
    assert audit_cutoff(cutoff, cutoff - timedelta(days=10)) < cutoff - timedelta(days=10)


def test_verify_tiling_reads_a_prunes_positions_instead_of_reporting_gaps():
    kept = [batch(7, spans={0: (70, 80)}), batch(8, spans={0: (80, 90)})]
    committed = {("t", 0): 90, ("t", 1): 5}  # partition 1 was read only by pruned batches
    assert check_tiling(kept, committed, []) != []  # without the prune's row: partition 1 is unexplained
    prune_row = AuditEntry(3, "p", NOW, "me", PRUNE_ACTION, "why", None,
                           {"positions": [{"topic": "t", "partition": 0, "offset": 70},
                                          {"topic": "t", "partition": 1, "offset": 5}]})
    assert check_tiling(kept, committed, audited_moves([prune_row])) == []
    # a real gap between kept batches is still found
    gap = [batch(7, spans={0: (70, 80)}), batch(8, spans={0: (85, 90)})]
    assert [f.subject for f in check_tiling(gap, committed, audited_moves([prune_row]))] == ["t[0]"]


def test_verify_does_not_ask_a_pruned_history_for_the_batches_of_runs_older_than_the_prune():
    cutoff = NOW - timedelta(days=90)
    kept = [batch(7), batch(8)]  # batches 0..6 (runs run-0 .. run-6) were pruned
    runs = [TaskRun(f"run-{i}", "success", started=cutoff - timedelta(days=10 - i)) for i in range(7)]
    runs += [TaskRun("run-7", "success", started=cutoff - timedelta(hours=1)),  # its batch written after the cutoff
             TaskRun("run-8", "success", started=cutoff + timedelta(days=1)),
             TaskRun("by-hand", "success", started=cutoff + timedelta(days=2)),  # a finding still
             TaskRun("unknown-start", "success")]  # no start known: still asked
    assert len(check_runs(runs, kept, pipeline_id="p")) == 9  # without the prune's row, every pruned run is one
    prune_row = AuditEntry(3, "p", NOW, "me", PRUNE_ACTION, "why", None, {"cutoff": cutoff.isoformat()})
    asked = runs_the_history_answers_for(runs, kept, [prune_row])
    assert [r.run_id for r in asked] == ["run-7", "run-8", "by-hand", "unknown-start"]
    assert sorted(f.subject for f in check_runs(asked, kept, pipeline_id="p")) == ["run by-hand", "run unknown-start"]
    assert runs_the_history_answers_for(runs, kept, []) == runs  # never pruned: every run is asked


class MemoryStore:
    """The pruner's store calls over lists (the SQL is tested on the real databases)."""

    def __init__(self, batches: list[tuple[BatchRecord, datetime]], audit: list[AuditEntry]) -> None:
        self.batches = {b.batch_id: (b, at) for b, at in batches}
        self.audit = {a.audit_id: a for a in audit}
        self.statements: list[int] = []

    def pipeline(self, pipeline_id: str) -> PipelineInfo:
        return PipelineInfo(pipeline_id, 1, None, Mode.CONTINUOUS, None, None)

    def pipelines(self) -> list[PipelineInfo]:
        return [self.pipeline("p")]

    def prune_facts(self, pipeline_id: str) -> tuple[int | None, int | None]:
        committed = [i for i, (b, _) in self.batches.items() if b.state is C]
        unfinished = [i for i, (b, _) in self.batches.items() if b.state in (P, BatchState.PLANNED)]
        return max(committed, default=None), min(unfinished, default=None)

    def prune_candidates(self, pipeline_id: str, after: int, below: int, cutoff: datetime, limit: int) -> list[Any]:
        return [(b, at) for i, (b, at) in sorted(self.batches.items()) if after < i < below
                and b.state in (C, A) and at < cutoff][:limit]

    def delete_batches(self, pipeline_id: str, ids: list[int], below: int, cutoff: datetime) -> int:
        self.statements.append(len(ids))
        for i in ids:
            del self.batches[i]
        return len(ids)

    def oldest_batch_time(self, pipeline_id: str, from_batch: int) -> datetime | None:
        return min((at for i, (_, at) in self.batches.items() if i >= from_batch), default=None)

    def audit_log(self, pipeline_id: str, limit: int) -> list[AuditEntry]:
        return sorted(self.audit.values(), key=lambda a: -a.audit_id)[:limit]

    def audit_candidates(self, pipeline_id: str, before: datetime, after_id: int, limit: int) -> list[int]:
        return [i for i, a in sorted(self.audit.items()) if i > after_id and a.at is not None and a.at < before][:limit]

    def delete_audit(self, pipeline_id: str, ids: list[int], before: datetime) -> int:
        for i in ids:
            del self.audit[i]
        return len(ids)

    def record_audit(self, pipeline_id: str, actor: str, action: str, reason: str, details: dict[str, Any]) -> None:
        new_id = max(self.audit, default=0) + 1
        self.audit[new_id] = AuditEntry(new_id, pipeline_id, NOW, actor, action, reason, None, details)


def test_the_pruner_removes_in_chunks_keeps_what_decides_and_audits_where_history_left_off():
    rows = [(batch(i), OLD) for i in range(12)] + [(batch(12, P), OLD), (batch(13), OLD)]
    audit = [AuditEntry(1, "p", OLD - timedelta(days=1), "me", "rewind", "old", 2, {}),
             AuditEntry(2, "p", NOW, "me", "recover", "new", 3, {})]
    store = MemoryStore(rows, audit)
    ops = SimpleNamespace(store=store, actor="me", recover=lambda *a, **k: SimpleNamespace(branches=[]),
                          _said=lambda exc, what: str(exc))
    pruner = HistoryPruner(ops, chunk=5)  # type: ignore[arg-type]
    dry = pruner.prune(90 * 86400, now=NOW)
    assert [(p.batches, p.audit_rows) for p in dry.pipelines] == [(12, 1)] and len(store.batches) == 14
    done = pruner.prune(90 * 86400, apply=True, reason="retention", now=NOW)
    assert [(p.batches, p.kept_below) for p in done.pipelines] == [(12, 12)]
    assert sorted(store.batches) == [12, 13]  # the prepared batch and the last committed one after it
    assert store.statements == [5, 5, 2]  # bounded statements
    assert [a.action for a in store.audit.values()] == ["recover", PRUNE_ACTION]
    assert store.audit[3].details["positions"] == [{"topic": "t", "partition": 0, "offset": 120}]
    with pytest.raises(OperationError, match="--reason"):
        pruner.prune(90 * 86400, apply=True, now=NOW)
