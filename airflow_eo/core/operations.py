"""The decisions of operating a pipeline (``airflow eo``), as plain functions over plain data.

What happens to an in-doubt XA branch (:func:`decide_branch`), which unfinished batches a Kafka
sink already committed (:func:`committed_by_kafka`), a partition's lag (:func:`partition_status`),
what a rewind moves and whether it may (:func:`plan_rewind`, :func:`check_rewind`). The sink
adapters' recovery and the operations module (``airflow_eo/operations.py``, used by the CLI) call
these same functions: each decision is written once. No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import OperationError
from airflow_eo.core.planning import PartitionOffsets
from airflow_eo.core.protocol import BatchRecord
from airflow_eo.core.ranges import OffsetRange, TopicPartition
from airflow_eo.core.states import BatchState
from airflow_eo.core.xid import Xid

# --------------------------------------------------------------------------- what the store holds


@dataclass(frozen=True)
class PipelineInfo:
    """A row of ``eo_pipeline``: the pipeline's fencing epoch, who runs it, how, and into which sink."""

    pipeline_id: str
    epoch: int
    owner: str | None
    mode: Mode | None
    taken_at: datetime | None
    sink: SinkRecord | None  # None: its last take predates sink recording


@dataclass(frozen=True)
class BatchInfo:
    """A row of ``eo_batch`` with its timestamps (UTC)."""

    record: BatchRecord
    created_at: datetime | None
    updated_at: datetime | None
    committed_at: datetime | None

    @property
    def last_change(self) -> datetime | None:
        return self.committed_at or self.updated_at or self.created_at


@dataclass(frozen=True)
class AuditEntry:
    """A row of ``eo_audit``: an operation a person ran on the pipeline (rewind, recover)."""

    audit_id: int
    pipeline_id: str
    at: datetime | None
    actor: str
    action: str
    reason: str | None
    epoch: int | None
    details: Mapping[str, Any]


# --------------------------------------------------------------------------- in-doubt XA branches


class BranchAction(str, Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class BranchDecision:
    """What recovery does with one prepared XA branch of the pipeline, and why."""

    xid: str
    batch_id: int
    epoch: int
    partition: int
    action: BranchAction
    reason: str


def decide_branch(xid: Xid, batch: BatchRecord | None) -> BranchDecision:
    """Commit a prepared branch if its batch is committed and lists the xid, else roll it back.

    The store's commit point decides: a batch counts once committed, and then exactly with the
    branches it recorded. Every recovery of an XA sink (a task attempt's step 2, ``airflow eo recover``)
    and every report of what it would do (``airflow eo status``) goes through here.

    :param xid: the prepared branch (``XA RECOVER``).
    :param batch: its batch's row in the store (``xid.batch_id``), None when there is none.
    """
    b = xid.batch_id
    if batch is None:
        action, reason = BranchAction.ROLLBACK, (f"batch {b} is not in the offset store (forgotten, or never "
                                                 "recorded): nothing of it counts")
    elif batch.state == BatchState.COMMITTED and xid.encode() in batch.xids:
        action, reason = BranchAction.COMMIT, (f"batch {b} passed its commit point and recorded this branch: "
                                               "its rows count, only the XA COMMIT is missing")
    elif batch.state == BatchState.COMMITTED:
        action, reason = BranchAction.ROLLBACK, (f"batch {b} committed without this branch (a failed Spark task's "
                                                 "or an older attempt's): its rows are not part of the batch")
    elif batch.state == BatchState.ABORTED:
        action, reason = BranchAction.ROLLBACK, f"batch {b} was aborted"
    else:
        action, reason = BranchAction.ROLLBACK, (f"batch {b} is {batch.state.value} and never reached its commit "
                                                 "point: its records are written again when the batch runs again")
    return BranchDecision(xid.encode(), b, xid.epoch, xid.partition, action, reason)


# --------------------------------------------------------------------------- unfinished batches


def committed_by_kafka(unfinished: Sequence[BatchRecord], group_offsets: Mapping[TopicPartition, int]) -> set[int]:
    """The unfinished batches a Kafka transactional sink committed (its commit point) but the store did not.

    Kafka committed a batch when the pipeline's consumer group reached the end of each of its
    non-empty ranges: the group's offsets move only inside the batch's transaction.

    :param unfinished: the store's unfinished batches of the pipeline.
    :param group_offsets: the group's committed offsets (``read_committed``, stable).
    """
    committed = set()
    for batch in unfinished:
        moved = [r for r in batch.ranges if r.size > 0]
        if moved and all(group_offsets.get(r.key) == r.until_offset for r in moved):
            committed.add(batch.batch_id)
    return committed


class BatchAction(str, Enum):
    ROLL_FORWARD = "roll forward"
    ABORT = "abort"


def decide_unfinished(batch: BatchRecord, committed_by_sink: set[int]) -> tuple[BatchAction, str]:
    """What ``airflow eo recover`` (:func:`~airflow_eo.core.protocol.recover_pipeline` without a run) does with
    an unfinished batch, and why; a retry of the batch's own run would resume it instead of aborting it.

    :param batch: the unfinished batch.
    :param committed_by_sink: ids of the batches the sink reports committed (its own commit point).
    """
    if batch.batch_id in committed_by_sink:
        return BatchAction.ROLL_FORWARD, ("the sink committed it (its own commit point) but the store did not "
                                          "record it: the store records it now")
    return BatchAction.ABORT, (f"{batch.state.value}, never committed: aborted (its branches rolled back); "
                               "its ranges are planned again by the next run")


# --------------------------------------------------------------------------- partitions and lag


@dataclass(frozen=True)
class PartitionStatus:
    """One partition of a pipeline: its committed offset next to what the broker holds.

    :param committed: the next offset the pipeline processes; None when it never committed the partition.
    :param log_start: the earliest offset the broker still stores (None: unknown).
    :param last_stable: the end for ``read_committed`` readers (None: unknown).
    """

    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    last_stable: int | None

    @property
    def lag(self) -> int | None:
        """Offsets not processed yet that can still be read (an upper bound of records)."""
        if self.last_stable is None or self.log_start is None:
            return None
        start = self.log_start if self.committed is None else max(self.committed, self.log_start)
        return max(0, self.last_stable - start)

    @property
    def lost(self) -> int:
        """Offsets deleted by retention before the pipeline read them (the next batch fails or skips them)."""
        if self.committed is None or self.log_start is None:
            return 0
        return max(0, self.log_start - self.committed)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "committed": self.committed,
                "last_stable": self.last_stable, "log_start": self.log_start, "lag": self.lag, "lost": self.lost}


def partition_status(partitions: Sequence[PartitionOffsets] | None,
                     committed: Mapping[TopicPartition, int]) -> list[PartitionStatus]:
    """Every partition the store or the broker knows of the pipeline's topics, sorted.

    :param partitions: what the broker says of the topics' partitions; None when it could not be asked.
    :param committed: the pipeline's committed offsets.
    """
    broker = {p.key: p for p in partitions or ()}
    return [PartitionStatus(key[0], key[1], committed.get(key),
                            broker[key].log_start if key in broker else None,
                            broker[key].last_stable if key in broker else None)
            for key in sorted(set(broker) | set(committed))]


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


def parse_offsets(text: str) -> dict[TopicPartition, int]:
    """``--to-offsets`` JSON, in the form of Spark's ``startingOffsets``: ``{"topic": {"0": 42, "1": 7}}``.

    :param text: the JSON text.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OperationError(f"--to-offsets is not JSON ({exc.msg}); use e.g. '{{\"page_views\": {{\"0\": 42}}}}'") \
            from None
    offsets: dict[TopicPartition, int] = {}
    if not isinstance(data, dict) or not data:
        raise OperationError('--to-offsets must be a JSON object {"topic": {"partition": offset, ...}, ...}')
    for topic, partitions in data.items():
        if not isinstance(partitions, dict) or not partitions:
            raise OperationError(f'--to-offsets: topic {topic!r} must map partitions to offsets: {{"0": 42}}')
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise OperationError(f"--to-offsets: {topic}[{partition}]={offset!r}: partitions and offsets must "
                                     "be non-negative integers")
            offsets[(str(topic), int(partition))] = offset
    return offsets


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
        what = "appends its output" if sink.kind == "KafkaTransactionalSink" else "adds to existing rows ('add')"
        raise OperationError(f"pipeline {p!r} writes through {sink.kind}, which {what}: reprocessing the rewound "
                             f"offsets counts those records twice. Pass {DOUBLE_COUNT_FLAG} if that is what you want "
                             "(e.g. after removing their effect from the sink yourself)")
