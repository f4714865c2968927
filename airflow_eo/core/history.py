"""What ``airflow eo prune`` may remove of the store's history: the decisions, made here once.

The batch log (``eo_batch``) is what decides a pipeline's future and its in-doubt work, so a row goes only when
nothing can need it any more:

- never in interval mode: a committed batch is the record that its interval was done (a cleared run of an old
  interval finds it and does nothing); without it the interval would be written again;
- never the pipeline's last committed batch, nor any batch after it (the planner allocates the next batch id after
  the newest, and an aborted batch's id must not be reused: xids and transactional ids carry it);
- never an unfinished batch (planned, prepared), nor any batch from the oldest unfinished one on;
- never a batch an in-doubt branch names (``recover`` decides a branch by its batch's row: a committed batch whose
  branch is still prepared would otherwise be rolled back);
- only committed or aborted batches last written before the cutoff.

The dead letters of the batches pruned go with them (:class:`DeadLetterRetention`, the sinks' side), never those of
a batch kept. Audit rows go when older than the cutoff and older than the oldest batch kept (a rewind or a recovery
between two kept batches is what ``verify`` explains them with), never the newest ``prune`` row: it records where
the pruned history left each partition (:func:`positions_left`), which ``verify``'s tiling reads as the start of
what it checks (:func:`airflow_eo.core.verify.audited_moves`): pruned batches are not gaps.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode
from airflow_eo.core.errors import OperationError
from airflow_eo.core.ranges import TopicPartition

#: The audit action of a prune.
PRUNE_ACTION = "prune"
#: The shortest retention accepted: shorter would remove what an operator is still looking at (today's batches).
MIN_RETENTION_S = 86_400.0
#: Rows per DELETE statement (each in its own transaction: a big prune never holds many locks for long).
DEFAULT_CHUNK = 500
#: The states a batch may be pruned in.
PRUNABLE_STATES = (BatchState.COMMITTED, BatchState.ABORTED)


def check_retention(older_than_s: float) -> None:
    """Refuse a retention shorter than :data:`MIN_RETENTION_S`."""
    if older_than_s < MIN_RETENTION_S:
        raise OperationError(f"--older-than {older_than_s:g}s is shorter than a day: prune keeps at least a day of "
                             "history (give e.g. 90d)")


@dataclass(frozen=True)
class PruneBounds:
    """A pipeline's facts that bound what may go.

    :param mode: the pipeline's mode (None: it never ran).
    :param last_committed: its newest committed batch id (None: none).
    :param oldest_unfinished: its oldest planned or prepared batch id (None: none).
    :param in_doubt: the batch ids its in-doubt branches name.
    """

    mode: Mode | None
    last_committed: int | None
    oldest_unfinished: int | None
    in_doubt: frozenset[int] = frozenset()


def prune_below(bounds: PruneBounds) -> tuple[int | None, str | None]:
    """The batch id below which batches may go (None: none may), and why not, when none may."""
    if bounds.mode is Mode.INTERVAL:
        return None, ("interval mode: each committed batch records that its interval was done (a cleared run of it "
                      "finds the batch and writes nothing); its batches are kept")
    if bounds.last_committed is None:
        return None, "no committed batch yet"
    below = bounds.last_committed
    if bounds.oldest_unfinished is not None:
        below = min(below, bounds.oldest_unfinished)
    return below, None


def prunable(batches: Iterable[BatchRecord], changed_at: Mapping[int, datetime | None], below: int,
             cutoff: datetime, in_doubt: Iterable[int] = ()) -> list[int]:
    """The ids of ``batches`` that may go: committed or aborted, below ``below``, last written before ``cutoff``,
    named by no in-doubt branch.

    :param batches: candidate rows.
    :param changed_at: batch id -> when the row was last written (UTC).
    :param below: :func:`prune_below`'s bound.
    :param cutoff: now minus the retention.
    :param in_doubt: batch ids in-doubt branches name.
    """
    keep = set(in_doubt)
    out = []
    for b in batches:
        at = changed_at.get(b.batch_id)
        if (b.state in PRUNABLE_STATES and b.batch_id < below and b.batch_id not in keep and at is not None
                and at < cutoff):
            out.append(b.batch_id)
    return sorted(out)


def positions_left(batches: Iterable[BatchRecord], known: Mapping[TopicPartition, int] | None = None
                   ) -> dict[TopicPartition, int]:
    """Where the committed batches among ``batches`` (in batch order, after ``known``) left each partition."""
    left = dict(known or {})
    for b in sorted(batches, key=lambda b: b.batch_id):
        if b.state is BatchState.COMMITTED:
            for r in b.ranges:
                left[r.key] = r.until_offset
    return left


def audit_cutoff(cutoff: datetime, oldest_kept_batch: datetime | None) -> datetime:
    """Audit rows before this go: the retention's cutoff, or earlier when a kept batch is older (what explains it
    stays)."""
    if oldest_kept_batch is None:
        return cutoff
    return min(cutoff, oldest_kept_batch - timedelta(seconds=1))


def positions_to_json(positions: Mapping[TopicPartition, int]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(positions.items())]


def positions_from_json(rows: Sequence[Mapping[str, Any]]) -> dict[TopicPartition, int]:
    return {(str(r["topic"]), int(r["partition"])): int(r["offset"]) for r in rows}


@runtime_checkable
class DeadLetterRetention(Protocol):
    """A sink whose dead letters (in its database, keyed by the pipeline and the batch) a prune removes with their
    batches: the dead letters of batches pruned go too."""

    def prune_dead_letters(self, pipeline_id: str, through_batch: int, keep: Collection[int], apply: bool,
                           chunk: int) -> int:
        """Remove (``apply``) or count the pipeline's dead letters of batches up to ``through_batch`` but ``keep``,
        in statements of ``chunk`` rows (each its own transaction, waiting briefly on a row lock); how many."""


@dataclass
class PipelinePrune:
    """What a prune removes (or would remove) of one pipeline."""

    pipeline_id: str
    batches: int = 0
    audit_rows: int = 0
    dead_letters: int = 0
    kept_below: int | None = None  # batches from this id on are kept
    pruned_through: int | None = None  # the newest batch id pruned (now or before)
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    skipped: str | None = None  # why nothing of its batches goes
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "batches": self.batches, "audit_rows": self.audit_rows,
                "dead_letters": self.dead_letters,
                "kept_from_batch": self.kept_below, "pruned_through": self.pruned_through,
                "positions": positions_to_json(self.positions), "skipped": self.skipped,
                "notes": list(self.notes)}
