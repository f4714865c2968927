"""Rewind planning (``airflow eo rewind``): what a rewind moves (:func:`plan_rewind`) and whether it may
(:func:`check_rewind`, run again by the store under the pipeline row's lock). No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import OperationError
from airflow_eo.core.planning import PartitionOffsets
from airflow_eo.core.ranges import OffsetRange, TopicPartition
from airflow_eo.core.sink_kinds import capabilities_of

# --------------------------------------------------------------------------- rewind


class RewindKind(str, Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    DATETIME = "datetime"
    OFFSETS = "offsets"


@dataclass(frozen=True)
class RewindTarget:
    """Where to move a pipeline's committed offsets (``airflow eo rewind --to-...``)."""

    kind: RewindKind
    at: datetime | None = None  # DATETIME
    offsets: Mapping[TopicPartition, int] | None = None  # OFFSETS: only the partitions named move

    def __str__(self) -> str:
        if self.kind is RewindKind.DATETIME and self.at is not None:
            return f"datetime {self.at.isoformat()}"
        if self.kind is RewindKind.OFFSETS and self.offsets is not None:
            return "offsets " + ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(self.offsets.items()))
        return self.kind.value


@dataclass(frozen=True)
class PartitionChange:
    """One partition's committed offset before and after a rewind."""

    topic: str
    partition: int
    old: int | None  # None: the pipeline never committed the partition
    new: int

    @property
    def reprocessed(self) -> OffsetRange | None:
        """Offsets the pipeline processes again (moved back)."""
        if self.old is None or self.new >= self.old:
            return None
        return OffsetRange(self.topic, self.partition, self.new, self.old)

    @property
    def skipped(self) -> OffsetRange | None:
        """Offsets the pipeline never processes (moved forward)."""
        if self.old is None or self.new <= self.old:
            return None
        return OffsetRange(self.topic, self.partition, self.old, self.new)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "old": self.old, "new": self.new,
                "reprocessed": self.reprocessed.size if self.reprocessed else 0,
                "skipped": self.skipped.size if self.skipped else 0}


@dataclass(frozen=True)
class RewindPlan:
    """What a rewind changes: every partition it moves, old -> new."""

    pipeline_id: str
    target: RewindTarget
    changes: tuple[PartitionChange, ...]

    @property
    def moved(self) -> tuple[PartitionChange, ...]:
        return tuple(c for c in self.changes if c.old != c.new)

    @property
    def reprocesses(self) -> bool:
        return any(c.reprocessed for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "target": str(self.target),
                "partitions": [c.to_dict() for c in self.changes],
                "reprocessed": sum(c.reprocessed.size for c in self.changes if c.reprocessed),
                "skipped": sum(c.skipped.size for c in self.changes if c.skipped)}


def plan_rewind(pipeline_id: str, target: RewindTarget, partitions: Sequence[PartitionOffsets],
                committed: Mapping[TopicPartition, int],
                at_time: Mapping[TopicPartition, int] | None = None) -> RewindPlan:
    """The new committed offset of each partition of the pipeline's topics.

    A new offset must lie between the partition's log-start offset (older records were deleted:
    the next batch could not read them) and its last stable offset (beyond it the next batch
    fails: "committed offset is beyond the end of the partition").

    :param pipeline_id: the pipeline.
    :param target: where to.
    :param partitions: the broker's log-start and last stable offsets of every partition of the topics.
    :param committed: the pipeline's committed offsets.
    :param at_time: DATETIME: per partition, the first offset at or after ``target.at`` (the end when none).
    """
    broker = {p.key: p for p in partitions}
    wanted: dict[TopicPartition, int]
    if target.kind is RewindKind.EARLIEST:
        wanted = {k: p.log_start for k, p in broker.items()}
    elif target.kind is RewindKind.LATEST:
        wanted = {k: p.last_stable for k, p in broker.items()}
    elif target.kind is RewindKind.DATETIME:
        if at_time is None:
            raise ValueError("a rewind to a datetime needs the offsets at that time")
        wanted = dict(at_time)
    else:
        wanted = dict(target.offsets or {})
        unknown = sorted(k for k in wanted if k not in broker)
        if unknown:
            known = ", ".join(f"{t}[{p}]" for t, p in sorted(broker)) or "none"
            raise OperationError(f"pipeline {pipeline_id!r} reads no partition "
                                 f"{', '.join(f'{t}[{p}]' for t, p in unknown)}; its partitions are {known}")
    problems = []
    for key, offset in sorted(wanted.items()):
        p = broker[key]
        if offset < p.log_start:
            problems.append(f"{key[0]}[{key[1]}] offset {offset} is below the log-start offset {p.log_start} "
                            "(older records were deleted by retention)")
        elif offset > p.last_stable:
            problems.append(f"{key[0]}[{key[1]}] offset {offset} is beyond the last stable offset {p.last_stable}")
    if problems:
        raise OperationError("cannot rewind there: " + "; ".join(problems))
    changes = tuple(PartitionChange(key[0], key[1], committed.get(key), wanted.get(key, committed.get(key, 0)))
                    for key in sorted(set(broker))
                    if key in wanted or key in committed)
    return RewindPlan(pipeline_id, target, changes)


DOUBLE_COUNT_FLAG = "--i-understand-reprocessing-double-counts"


def check_rewind(plan: RewindPlan, mode: Mode | None, unfinished: Sequence[BatchRecord], sink: SinkRecord | None,
                 allow_double_count: bool) -> None:
    """Refuse a rewind that would break the pipeline or, unasked, count records twice.

    :param plan: the rewind.
    :param mode: the pipeline's mode (interval mode has no committed position to move).
    :param unfinished: the pipeline's unfinished batches (a running attempt, or one that crashed).
    :param sink: what the store recorded of the sink; None when unknown.
    :param allow_double_count: the operator accepted that an accumulating sink counts reprocessed records twice.
    """
    p = plan.pipeline_id
    if mode is Mode.INTERVAL:
        raise OperationError(f"pipeline {p!r} runs in interval mode: its batches are data intervals, not a committed "
                             "position. Re-run (clear) the intervals to process them again")
    if unfinished:
        ids = ", ".join(f"{b.batch_id} ({b.state.value}, run {b.run_id})" for b in unfinished)
        raise OperationError(f"pipeline {p!r} has an unfinished batch: {ids}. A running attempt, or one that crashed: "
                             f"wait for it, or resolve it with `airflow eo recover {p}`, then rewind")
    if not plan.reprocesses or allow_double_count:
        return
    if sink is None:
        raise OperationError(f"the offset store does not know pipeline {p!r}'s sink (its last run predates sink "
                             "recording), so it cannot tell whether reprocessing counts records twice. Run the "
                             f"pipeline once, or pass {DOUBLE_COUNT_FLAG}")
    if sink.accumulating:
        capabilities = capabilities_of(sink)
        what = "appends its output" if capabilities and capabilities.appends else "adds to existing rows ('add')"
        raise OperationError(f"pipeline {p!r} writes through {sink.kind}, which {what}: reprocessing the rewound "
                             f"offsets counts those records twice. Pass {DOUBLE_COUNT_FLAG} if that is what you want "
                             "(e.g. after removing their effect from the sink yourself)")
