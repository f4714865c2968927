"""Batch states of the offset store's batch log and the transitions allowed between them."""

from __future__ import annotations

from enum import Enum


class BatchState(str, Enum):
    PLANNED = "planned"  # ranges written, no data read yet (write-ahead)
    PREPARED = "prepared"  # XA branches prepared, xids recorded
    COMMITTED = "committed"  # offsets moved: the commit point passed
    ABORTED = "aborted"  # given up; its branches are rolled back


ALLOWED_TRANSITIONS: dict[BatchState, frozenset[BatchState]] = {
    BatchState.PLANNED: frozenset({BatchState.PREPARED, BatchState.COMMITTED, BatchState.ABORTED}),
    BatchState.PREPARED: frozenset({BatchState.PREPARED, BatchState.COMMITTED, BatchState.ABORTED}),
    BatchState.COMMITTED: frozenset(),
    BatchState.ABORTED: frozenset(),
}

UNFINISHED = (BatchState.PLANNED, BatchState.PREPARED)


def can_transition(current: BatchState, target: BatchState) -> bool:
    return target in ALLOWED_TRANSITIONS[current]
