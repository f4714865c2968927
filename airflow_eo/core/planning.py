"""Planning one micro-batch: which offset range of each partition it reads.

Pure logic. The Kafka adapter supplies, per partition, the log-start offset, the
last stable offset (READ_COMMITTED end) and where a partition never seen before
starts; the offset store supplies the committed positions (continuous mode). In
interval mode the adapter supplies the offsets of the interval's two timestamps
(``offsets_for_times``) instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from airflow_eo.core.errors import ConfigurationError, DataLossError, IntervalNotReadyError
from airflow_eo.core.ranges import OffsetRange, TopicPartition


@dataclass(frozen=True)
class PartitionOffsets:
    """What the broker says about one partition right now."""

    topic: str
    partition: int
    log_start: int  # earliest offset still stored
    last_stable: int  # end for read_committed readers (exclusive)
    initial: int  # where to start if the pipeline never committed this partition

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class Plan:
    ranges: list[OffsetRange]
    skipped: list[OffsetRange] = field(default_factory=list)  # lost to retention, skipped by option


def plan_batch(
    partitions: Sequence[PartitionOffsets],
    committed: Mapping[TopicPartition, int],
    max_records_per_run: int | None = None,
    skip_lost_records: bool = False,
) -> Plan:
    """Ranges from each partition's committed position up to its last stable offset.

    A start below the log-start offset means records were deleted before we read
    them: fail naming the lost range, or (``skip_lost_records``) start at the
    log-start offset and report the skipped range.
    """
    starts: dict[TopicPartition, int] = {}
    skipped: list[OffsetRange] = []
    lost: list[OffsetRange] = []
    for p in partitions:
        start = committed.get(p.key, p.initial)
        if start > p.last_stable:
            raise DataLossError(
                f"{p.topic}[{p.partition}]: committed offset {start} is beyond the end of the "
                f"partition ({p.last_stable}); was the topic deleted and re-created? "
                "Reset the pipeline's offsets to continue."
            )
        if start < p.log_start:
            gap = OffsetRange(p.topic, p.partition, start, p.log_start)
            (skipped if skip_lost_records else lost).append(gap)
            start = p.log_start
        starts[p.key] = start
    if lost:
        details = "; ".join(f"{r.topic}[{r.partition}] offsets {r.from_offset}..{r.until_offset - 1}"
                            for r in lost)
        raise DataLossError(
            f"records were deleted by retention before this pipeline read them: {details}. "
            "Nothing was committed. Raise the topic's retention, or set skip_lost_records=True "
            "to skip them (the skipped ranges are recorded in the batch)."
        )
    lags = {p.key: p.last_stable - starts[p.key] for p in partitions}
    quotas = share_by_lag(lags, max_records_per_run)
    ranges = [
        OffsetRange(p.topic, p.partition, starts[p.key], starts[p.key] + quotas[p.key])
        for p in partitions
    ]
    return Plan(sorted(ranges), sorted(skipped))


def share_by_lag(lags: Mapping[TopicPartition, int], cap: int | None) -> dict[TopicPartition, int]:
    """Split ``cap`` offsets across partitions in proportion to their lag.

    Largest-remainder rounding, so the shares add up to exactly ``min(cap, total lag)``
    and no partition gets more than its lag.
    """
    total = sum(lags.values())
    if cap is None or total <= cap:
        return dict(lags)
    if cap <= 0:
        raise ValueError("max_records_per_run must be positive")
    shares = {k: cap * lag // total for k, lag in lags.items()}
    leftover = cap - sum(shares.values())
    by_remainder = sorted(lags, key=lambda k: (-(cap * lags[k] % total), k))
    for k in by_remainder[:leftover]:
        shares[k] += 1
    return shares


# --------------------------------------------------------------------------- interval mode


@dataclass(frozen=True)
class Interval:
    """A DAG run's data interval ``[start, end)``: the identity of an interval-mode batch."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ConfigurationError(f"interval {self.start}..{self.end}: timestamps must carry a time zone")
        if not self.start < self.end:
            raise ConfigurationError(
                f"interval {self.start.isoformat()}..{self.end.isoformat()} is empty: interval mode needs "
                "a data interval whose end is after its start (a schedule with a timetable, not a manual run)"
            )
        object.__setattr__(self, "start", self.start.astimezone(timezone.utc))
        object.__setattr__(self, "end", self.end.astimezone(timezone.utc))

    @property
    def start_ms(self) -> int:
        return _millis(self.start)

    @property
    def end_ms(self) -> int:
        return _millis(self.end)

    def __str__(self) -> str:
        return f"{self.start.isoformat()}..{self.end.isoformat()}"


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class IntervalOffsets:
    """What the broker says about one partition for an interval: ``offsets_for_times`` of both ends.

    ``start`` / ``end`` are the first offsets whose record timestamp is at or after the
    interval's start / end, None where the partition has no such record yet.
    ``high_watermark`` (the end including open transactions) and ``log_append_time`` (the
    topic's ``message.timestamp.type``) let an idle partition's end be closed (see
    :func:`plan_interval`); None / False where unknown.
    """

    topic: str
    partition: int
    log_start: int
    last_stable: int
    start: int | None
    end: int | None
    high_watermark: int | None = None
    log_append_time: bool = False

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


def plan_interval(partitions: Sequence[IntervalOffsets], interval: Interval, *,
                  idle_timeout: timedelta | None = None, now: datetime | None = None) -> Plan:
    """The ranges of an interval: ``[offset_for(start), offset_for(end))`` per partition.

    Adjacent intervals share a boundary timestamp, hence a boundary offset: their ranges
    are contiguous and never overlap. The end is final only once a record at or after it
    exists below the last stable offset (later appends get higher offsets); until then
    the interval is not ready and nothing is planned.

    An idle partition (no record at or after the end) is closed at its last stable offset
    when ``idle_timeout`` is set, ``now`` is at least that long after the end, the topic
    stamps records with the broker's append time and no transaction is open on it. Every
    later record is then stamped after the end, so ``offset_for(end)`` can only ever be that
    offset: the neighbour interval, planned at any time, gets the same boundary. With
    producer timestamps (``CreateTime``) a late record could still belong before the end,
    so such a partition keeps the interval waiting.
    """
    idle_closes = idle_timeout is not None and now is not None and now >= interval.end + idle_timeout

    def end_of(p: IntervalOffsets) -> int | None:
        if p.end is not None:
            return p.end if p.end <= p.last_stable else None
        if idle_closes and p.log_append_time and p.high_watermark == p.last_stable:
            return p.last_stable
        return None

    ends = {p.key: end_of(p) for p in partitions}
    waiting = [p for p in partitions if ends[p.key] is None]
    if waiting:
        details = "; ".join(f"{p.topic}[{p.partition}] (last stable offset {p.last_stable}"
                            f"{_why_waiting(p, idle_timeout is not None)})" for p in waiting)
        hint = ("" if idle_timeout is not None else
                " A partition that may stay idle can be closed with idle_partition_timeout on a topic with "
                "message.timestamp.type=LogAppendTime.")
        raise IntervalNotReadyError(
            f"interval {interval} is not complete yet: no committed record at or after "
            f"{interval.end.isoformat()} in {details}. Nothing was planned; a later attempt "
            f"(the task's retry) plans it once every partition has moved past the interval's end.{hint}"
        )
    ranges = []
    for p in partitions:
        end = ends[p.key]
        assert end is not None
        start = end if p.start is None else min(p.start, end)
        ranges.append(OffsetRange(p.topic, p.partition, start, end))
    return Plan(sorted(ranges))


def _why_waiting(p: IntervalOffsets, idle_asked: bool) -> str:
    if p.end is not None:
        return ", a record after the end is still in an open transaction"
    if p.high_watermark is not None and p.high_watermark > p.last_stable:
        return f", an open transaction holds offsets up to {p.high_watermark}"
    if idle_asked and not p.log_append_time:
        return ", producer timestamps (CreateTime): an idle partition cannot be closed"
    return ""


def check_replayable(partitions: Sequence[IntervalOffsets], ranges: Sequence[OffsetRange]) -> None:
    """A replay reads the recorded ranges again: fail clearly when retention deleted part of them."""
    log_start = {p.key: p.log_start for p in partitions}
    lost = [r for r in ranges if r.size and r.from_offset < log_start.get(r.key, 0)]
    if lost:
        details = "; ".join(f"{r.topic}[{r.partition}] offsets {r.from_offset}..{log_start[r.key] - 1}" for r in lost)
        raise DataLossError(
            f"cannot replay the interval: records were deleted by retention since it was first processed: "
            f"{details}. The sink keeps what the first run wrote; nothing was replayed."
        )
