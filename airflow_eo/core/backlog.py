"""How far behind a pipeline is: unprocessed offsets per partition (its lag), the age of its oldest unprocessed
record, and when a wait on them is over. Pure logic."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.planning import PartitionOffsets, plan_batch
from airflow_eo.core.ranges import OffsetRange, TopicPartition


def unprocessed_ranges(partitions: Sequence[PartitionOffsets],
                       committed: Mapping[TopicPartition, int]) -> list[OffsetRange]:
    """What the next batch would read: from the committed position (or the start) to the last stable offset.

    Offsets lost to retention are not counted (they cannot be processed); offsets are an
    upper bound of records (transaction markers take offsets too).
    """
    return plan_batch(partitions, committed, skip_lost_records=True).ranges


def backlog(partitions: Sequence[PartitionOffsets], committed: Mapping[TopicPartition, int]) -> dict[str, int]:
    """Unprocessed offsets per ``"topic[partition]"``: last stable offset minus committed position."""
    return lag_of(unprocessed_ranges(partitions, committed))


def lag_of(ranges: Sequence[OffsetRange]) -> dict[str, int]:
    return {f"{r.topic}[{r.partition}]": r.size for r in ranges}


def backlog_reached(lag: Mapping[str, int], min_records: int, per_partition: bool) -> bool:
    """``min_records`` reached in total, or (``per_partition``) in some single partition."""
    if per_partition:
        return any(n >= min_records for n in lag.values())
    return sum(lag.values()) >= min_records


def oldest_age_seconds(first_timestamps_ms: Mapping[Any, int], now_ms: int) -> float | None:
    """Age of the oldest unprocessed record, from the timestamp of each partition's first unprocessed record
    (None when no partition has one). A producer's clock ahead of ours counts as age 0, never negative."""
    if not first_timestamps_ms:
        return None
    return max(0.0, (now_ms - min(first_timestamps_ms.values())) / 1000.0)


@dataclass(frozen=True)
class BacklogThreshold:
    """When a wait on a pipeline's backlog is over: ``min_records`` unprocessed (in total, or in one partition
    with ``per_partition``), or the oldest unprocessed record at least ``min_age_seconds`` old, whichever comes
    first. ``None`` leaves a condition out (at least one is needed)."""

    min_records: int | None = 1
    per_partition: bool = False
    min_age_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.min_records is None and self.min_age_seconds is None:
            raise ConfigurationError("give min_records, min_age, or both: with neither the wait never ends")
        if self.min_records is not None and self.min_records < 1:
            raise ConfigurationError("min_records must be >= 1")
        if self.min_age_seconds is not None and self.min_age_seconds <= 0:
            raise ConfigurationError("min_age must be a positive duration")

    @property
    def needs_age(self) -> bool:
        return self.min_age_seconds is not None

    def reached(self, lag: Mapping[str, int], age_seconds: float | None) -> bool:
        if self.min_records is not None and backlog_reached(lag, self.min_records, self.per_partition):
            return True
        return self.min_age_seconds is not None and age_seconds is not None and age_seconds >= self.min_age_seconds

    def report(self, lag: Mapping[str, int], age_seconds: float | None) -> dict[str, Any]:
        """What a sensor returns and a trigger's event carries (the age only when it is watched)."""
        seen: dict[str, Any] = {"lag": dict(lag), "total": sum(lag.values())}
        if self.needs_age:
            seen["oldest_age_seconds"] = age_seconds
        return seen

    def describe(self) -> str:
        parts = []
        if self.min_records is not None:
            parts.append(f"{self.min_records} records" + (" in one partition" if self.per_partition else ""))
        if self.min_age_seconds is not None:
            parts.append(f"a record {self.min_age_seconds:g} s old")
        return " or ".join(parts)
