"""``airflow eo prune``: the store's history beyond retention removed, in bounded statements, audited.

The decisions are :mod:`airflow_eo.core.history`'s (what may go); the reads and deletes are the store's
(:mod:`airflow_eo.sqlstore.history`), one chunk per statement and transaction; the in-doubt branches that keep
their batches are the ones ``recover`` (dry run) finds. The dead letters of the batches pruned go too, in the sink's
database (:class:`~airflow_eo.core.history.DeadLetterRetention`). This module does the I/O in order and imports
nothing of Airflow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_eo.core.config import Mode
from airflow_eo.core.errors import OperationError
from airflow_eo.core.history import (
    DEFAULT_CHUNK,
    PRUNE_ACTION,
    DeadLetterRetention,
    PipelinePrune,
    PruneBounds,
    audit_cutoff,
    check_retention,
    positions_from_json,
    positions_left,
    prunable,
    prune_below,
)
from airflow_eo.core.pipeline_status import PipelineInfo
from airflow_eo.ops.service import PipelineOperations

log = logging.getLogger(__name__)

#: How many of the newest audit rows are read for the newest prune's.
RECENT_AUDIT = 200


@dataclass(frozen=True)
class PruneReport:
    """What ``prune`` removed (or, in a dry run, would remove)."""

    dry_run: bool
    older_than_s: float
    cutoff: datetime
    pipelines: list[PipelinePrune] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "older_than_s": self.older_than_s,
                "cutoff": self.cutoff.isoformat(timespec="seconds"),
                "pipelines": [p.to_dict() for p in self.pipelines], "notes": list(self.notes)}


class HistoryPruner:
    """Prune the batch log and the audit log of one offset store.

    :param ops: the operations (store, sinks, actor) this runs over.
    :param chunk: rows per statement.
    :param max_chunks: at most this many chunks of batches and of audit rows per pipeline and call (None: all):
        the retention run after every batch (:func:`prune_after_batch`) removes a bounded share each time.
    """

    def __init__(self, ops: PipelineOperations, chunk: int = DEFAULT_CHUNK, max_chunks: int | None = None) -> None:
        self.ops = ops
        self.store = ops.store
        self.chunk = chunk
        self.max_chunks = max_chunks

    def prune(self, older_than_s: float, *, pipeline_id: str | None = None, apply: bool = False,
              reason: str | None = None, now: datetime | None = None) -> PruneReport:
        """Remove (``apply``) or count (the default) every pipeline's (or ``pipeline_id``'s) batches and audit rows
        older than ``older_than_s`` that nothing needs (:mod:`airflow_eo.core.history`); each pipeline pruned is
        audited (action ``prune``, with where its pruned batches left each partition)."""
        check_retention(older_than_s)
        if apply and not (reason or "").strip():
            raise OperationError("prune --apply needs --reason TEXT (recorded in the audit log)")
        cutoff = (now or datetime.now(timezone.utc)) - timedelta(seconds=older_than_s)
        infos = [self.store.pipeline(pipeline_id)] if pipeline_id is not None else self.store.pipelines()
        report = PruneReport(not apply, older_than_s, cutoff)
        for info in infos:
            try:
                report.pipelines.append(self._pipeline(info, cutoff, apply, (reason or "").strip()))
            except Exception as exc:  # one pipeline's sink down must not stop the others'
                report.notes.append(f"{info.pipeline_id}: not pruned ({self.ops.context.said(exc, 'prune')})")
        return report

    def _in_doubt(self, info: PipelineInfo) -> frozenset[int]:
        """The batch ids its in-doubt branches name (``recover``'s dry run); a sink it cannot read refuses."""
        if info.mode is Mode.INTERVAL or info.sink is None:
            return frozenset()
        recovery = self.ops.recover(info.pipeline_id, apply=False)
        return frozenset(b.decision.batch_id for b in recovery.branches)

    def _dead_letters(self, info: PipelineInfo, through: int, kept: set[int], apply: bool) -> int:
        """The dead letters of the batches pruned (up to ``through`` but ``kept``), in the sink's database."""
        if info.sink is None:
            return 0
        sink = self.ops.connections.sink(info.pipeline_id, info.sink)
        if not isinstance(sink, DeadLetterRetention):
            return 0
        return sink.prune_dead_letters(info.pipeline_id, through, sorted(k for k in kept if k <= through), apply,
                                       self.chunk)

    def _pipeline(self, info: PipelineInfo, cutoff: datetime, apply: bool, reason: str) -> PipelinePrune:
        p = info.pipeline_id
        last, oldest_unfinished = self.store.prune_facts(p)
        bounds = PruneBounds(info.mode, last, oldest_unfinished)
        below, why_not = prune_below(bounds)
        result = PipelinePrune(p, kept_below=below, skipped=why_not)
        # The newest prune's row: its positions continue, and it is never removed (verify reads them).
        prunes = [a for a in self.store.audit_log(p, RECENT_AUDIT) if a.action == PRUNE_ACTION]
        known = positions_from_json(prunes[0].details.get("positions", [])) if prunes else {}
        previous_through = prunes[0].details.get("pruned_through") if prunes else None
        first_kept = below if below is not None else 0
        # The first chunk before the in-doubt scan: with nothing old enough (every batch's retention run, mostly) the
        # sink is not asked.
        rows = self.store.prune_candidates(p, -1, below, cutoff, self.chunk) if below is not None else []
        if below is not None and rows:
            in_doubt = self._in_doubt(info)  # before anything goes: a sink that cannot be read stops here
            kept_ids: set[int] = set(in_doubt)
            positions = dict(known)
            through = previous_through
            chunks = 0
            while rows and (self.max_chunks is None or chunks < self.max_chunks):
                chunks += 1
                after = rows[-1][0].batch_id
                ids = prunable([b for b, _ in rows], {b.batch_id: at for b, at in rows}, below, cutoff, in_doubt)
                first_kept = min([first_kept, *(b.batch_id for b, _ in rows if b.batch_id not in set(ids))])
                kept_ids.update(b.batch_id for b, _ in rows if b.batch_id not in set(ids))
                if ids:
                    gone = set(ids)
                    positions = positions_left([b for b, _ in rows if b.batch_id in gone], positions)
                    through = max(ids) if through is None else max(through, max(ids))
                    result.batches += self.store.delete_batches(p, ids, below, cutoff) if apply else len(ids)
                rows = self.store.prune_candidates(p, after, below, cutoff, self.chunk)
            if rows:  # stopped at max_chunks: the rest is kept until the next call
                first_kept = min(first_kept, rows[0][0].batch_id)
            result.positions, result.pruned_through = positions, through
            if through is not None:
                try:
                    result.dead_letters = self._dead_letters(info, through, kept_ids, apply)
                except Exception as exc:  # the batches' prune stands (and is audited below); the next prune retries
                    said = self.ops.context.said(exc, "dead letters")
                    result.notes.append(f"its dead letters were not (all) removed ({said}); the next prune removes "
                                        "the rest")
        oldest_kept = self.store.oldest_batch_time(p, first_kept)
        before = audit_cutoff(cutoff, oldest_kept)
        keep = {prunes[0].audit_id} if prunes else set()
        after_id = -1
        chunks = 0
        while self.max_chunks is None or chunks < self.max_chunks:
            chunks += 1
            ids = self.store.audit_candidates(p, before, after_id, self.chunk)
            if not ids:
                break
            after_id = ids[-1]
            ids = [i for i in ids if i not in keep]
            result.audit_rows += self.store.delete_audit(p, ids, before) if apply else len(ids)
        if apply and (result.batches or result.audit_rows or result.dead_letters):
            self.store.record_audit(p, self.ops.actor, PRUNE_ACTION, reason, {**result.to_dict(),
                                                                                "cutoff": cutoff.isoformat()})
            log.info("pruned %d batches, %d audit rows and %d dead letters of %s", result.batches, result.audit_rows,
                     result.dead_letters, p)
        return result


#: Chunks of batches (and of audit rows) the retention run after a batch removes at most: with
#: :data:`~airflow_eo.core.history.DEFAULT_CHUNK` rows each, a year of hourly history is gone within a day of batches,
#: and no batch waits long on it.
CHUNKS_PER_BATCH = 1
#: Rows per chunk of that run.
RETENTION_CHUNK = DEFAULT_CHUNK


def prune_after_batch(ops: PipelineOperations, pipeline_id: str, retention_s: float, batch_id: int) -> PipelinePrune:
    """The operator's ``history_retention``: after batch ``batch_id`` committed, a bounded share of the pipeline's
    history older than ``retention_s`` goes (what ``airflow eo prune --apply`` would remove, at most
    :data:`CHUNKS_PER_BATCH` chunks of each kind), audited as a prune when anything went."""
    report = HistoryPruner(ops, chunk=RETENTION_CHUNK, max_chunks=CHUNKS_PER_BATCH).prune(
        retention_s, pipeline_id=pipeline_id, apply=True,
        reason=f"history_retention of {retention_s:g}s, after batch {batch_id}")
    if report.notes:
        raise OperationError("; ".join(report.notes))
    return report.pipelines[0]
