"""Kafka offset ranges: half-open ``[from_offset, until_offset)`` per topic partition.

Offsets have gaps (transaction markers, compaction), so a range's ``size`` is an
upper bound of the records it holds, never a record count.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    topic: str
    partition: int
    from_offset: int
    until_offset: int

    def __post_init__(self) -> None:
        if self.from_offset < 0 or self.until_offset < self.from_offset:
            raise ValueError(f"invalid offset range {self}")

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] {self.from_offset}..{self.until_offset}"


def ranges_to_json(ranges: Iterable[OffsetRange]) -> str:
    return json.dumps([asdict(r) for r in sorted(ranges)])


def ranges_from_json(text: str | bytes | None) -> list[OffsetRange]:
    if not text:
        return []
    return [OffsetRange(**item) for item in json.loads(text)]


def spark_offsets(ranges: Iterable[OffsetRange]) -> tuple[str, str]:
    """``startingOffsets`` / ``endingOffsets`` JSON for Spark's Kafka source (non-empty ranges)."""
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in sorted(ranges):
        if r.size == 0:
            continue
        starting.setdefault(r.topic, {})[str(r.partition)] = r.from_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.until_offset
    return json.dumps(starting), json.dumps(ending)


def check_contiguous(committed: Mapping[TopicPartition, int], ranges: Iterable[OffsetRange],
                     skipped: Iterable[OffsetRange] = ()) -> None:
    """Invariant: a batch starts exactly where the committed position of each partition is.

    A range lost to retention and skipped on purpose counts as part of the batch.
    """
    starts = batch_starts(ranges, skipped)
    for key, start in starts.items():
        expected = committed.get(key)
        if expected is not None and start != expected:
            raise AssertionError(
                f"batch starts {key[0]}[{key[1]}] at offset {start}, not at its committed offset {expected}"
            )


def repeated_partition(ranges: Iterable[OffsetRange]) -> TopicPartition | None:
    """The first partition ``ranges`` name twice (a batch moves each partition once), or None."""
    seen: set[TopicPartition] = set()
    for r in ranges:
        if r.key in seen:
            return r.key
        seen.add(r.key)
    return None


def batch_starts(ranges: Iterable[OffsetRange], skipped: Iterable[OffsetRange] = ()) -> dict[TopicPartition, int]:
    """Where the batch takes over each partition: the start of its skipped gap, else of its range."""
    starts = {r.key: r.from_offset for r in ranges}
    starts.update({s.key: s.from_offset for s in skipped})
    return starts
