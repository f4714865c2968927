"""Planning one micro-batch: which offset range of each partition it reads.

Pure logic. The Kafka adapter supplies, per partition, the log-start offset, the
last stable offset (READ_COMMITTED end) and where a partition never seen before
starts; the offset store supplies the committed positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from airflow_eo.core.errors import DataLossError
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

    @property
    def is_empty(self) -> bool:
        return all(r.size == 0 for r in self.ranges)

    @property
    def max_records(self) -> int:
        return sum(r.size for r in self.ranges)


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
