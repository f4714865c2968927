"""The input topic: :class:`FakeSource`, per partition a list of :class:`Record` with timestamps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.planning import Interval, IntervalOffsets, PartitionOffsets
from airflow_eo.core.ranges import OffsetRange, TopicPartition

RecordId = tuple[str, int, int]  # topic, partition, offset



@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int

    @property
    def id(self) -> RecordId:
        return (self.topic, self.partition, self.offset)

    @property
    def key(self) -> str:
        """The record's event id: the key column of the upsert sink's table."""
        return f"{self.topic}-{self.partition}-{self.offset}"

    @property
    def value(self) -> str:
        return f"value of {self.key} at {self.timestamp_ms}"


class FakeSource:
    """``OffsetSource`` over an in-memory topic: per partition a list of records (offset = index)."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.logs: dict[TopicPartition, list[Record]] = {(t, p): [] for t, n in partitions.items() for p in range(n)}
        self.log_start: dict[TopicPartition, int] = dict.fromkeys(self.logs, 0)
        self.clock_ms = 1_000

    def produce(self, topic: str, partition: int, count: int = 1, *, timestamp_ms: int | None = None) -> list[Record]:
        log = self.logs[(topic, partition)]
        made = []
        for _ in range(count):
            ts = self.clock_ms if timestamp_ms is None else timestamp_ms
            self.clock_ms = max(self.clock_ms, ts) + 1_000
            made.append(Record(topic, partition, len(log), ts))
            log.append(made[-1])
        return made

    def delete_before(self, tp: TopicPartition, offset: int) -> None:
        """Retention deleted the partition's records below ``offset``."""
        self.log_start[tp] = offset

    def end(self, tp: TopicPartition) -> int:
        return len(self.logs[tp])

    def ends(self) -> dict[TopicPartition, int]:
        return {tp: len(log) for tp, log in self.logs.items()}

    def records(self) -> list[Record]:
        return [rec for _, log in sorted(self.logs.items()) for rec in log]

    def read(self, r: OffsetRange) -> list[Record]:
        """Exactly the range, as Spark's Kafka source reads it (a range outside the log is an error)."""
        if r.from_offset < self.log_start[r.key] or r.until_offset > self.end(r.key):
            raise AssertionError(f"read {r} outside the log {self.log_start[r.key]}..{self.end(r.key)}")
        return self.logs[r.key][r.from_offset:r.until_offset]

    def _partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        for topic in topics:
            if not any(t == topic for t, _ in self.logs):
                raise ConfigurationError(f"Kafka topic {topic!r} does not exist")
        return sorted(tp for tp in self.logs if tp[0] in topics)

    def _offset_at(self, tp: TopicPartition, timestamp_ms: int) -> int | None:
        """``offsets_for_times``: the first offset whose timestamp is >= ``timestamp_ms``, None if there is none."""
        for rec in self.logs[tp][self.log_start[tp]:]:
            if rec.timestamp_ms >= timestamp_ms:
                return rec.offset
        return None

    def partition_offsets(self, topics: Sequence[str], starting_offsets: str | int) -> list[PartitionOffsets]:
        found = []
        for tp in self._partitions(topics):
            if starting_offsets == "earliest":
                initial = self.log_start[tp]
            elif starting_offsets == "latest":
                initial = self.end(tp)
            else:
                at = self._offset_at(tp, int(starting_offsets))
                initial = self.end(tp) if at is None else at
            found.append(PartitionOffsets(tp[0], tp[1], self.log_start[tp], self.end(tp), initial))
        return found

    def interval_offsets(self, topics: Sequence[str], interval: Interval) -> list[IntervalOffsets]:
        return [IntervalOffsets(tp[0], tp[1], self.log_start[tp], self.end(tp), self._offset_at(tp, interval.start_ms),
                                self._offset_at(tp, interval.end_ms), high_watermark=self.end(tp),
                                log_append_time=True)
                for tp in self._partitions(topics)]
