"""The offset store: :class:`FakeStore` (see the package's docstring)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_eo.core.batch import BatchRecord, BatchSummary, Owner
from airflow_eo.core.batch_states import UNFINISHED, BatchState, can_transition
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.errors import CommitConflictError, FencedError, PipelineConflictError
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange, TopicPartition, batch_starts


class DuplicateKeyError(Exception):
    """What MySQL raises on a unique key (``pymysql.err.IntegrityError`` 1062)."""


@dataclass
class _BatchRow:
    """A row of ``eo_batch``."""

    pipeline_id: str
    batch_id: int
    run_id: str
    run_key: str | None
    interval: Interval | None
    epoch: int
    state: BatchState
    ranges: list[OffsetRange]
    skipped: list[OffsetRange]
    xids: list[str] | None = None
    summary: BatchSummary | None = None  # as read back from the JSON column (see _as_stored)

    def record(self) -> BatchRecord:
        return BatchRecord(self.pipeline_id, self.batch_id, self.run_id, self.epoch, self.state, list(self.ranges),
                           list(self.skipped), list(self.xids or []), self.summary, self.interval)


def _as_stored(summary: BatchSummary) -> BatchSummary:
    """The summary through the store's JSON column and back."""
    return BatchSummary.from_dict(json.loads(json.dumps(summary.to_dict())))


#: The store's fenced writes (each one is a step before and a step ``:done`` after in a process).
STORE_WRITES = frozenset({"take_pipeline", "take_interval", "insert_batch", "adopt_batch", "mark_prepared",
                          "commit_batch", "abort_batch", "record_replay"})


class FakeStore:
    """``OffsetStore`` in memory with the semantics of ``SqlOffsetStore`` (each method is one transaction:
    it checks everything before it changes anything)."""

    def __init__(self) -> None:
        self.pipelines: dict[str, dict[str, Any]] = {}  # eo_pipeline: epoch, owner, mode
        self.intervals: dict[tuple[str, Interval], int] = {}  # eo_interval: epoch
        self.batches: dict[str, dict[int, _BatchRow]] = {}  # eo_batch
        self.offsets: dict[str, dict[TopicPartition, tuple[int, int]]] = {}  # eo_offset: next_offset, batch_id

    # ------------------------------------------------------------------ helpers of the tests

    def epoch(self, pipeline_id: str, interval: Interval | None = None) -> int | None:
        if interval is not None:
            return self.intervals.get((pipeline_id, interval))
        row = self.pipelines.get(pipeline_id)
        return None if row is None else row["epoch"]

    def all_batches(self, pipeline_id: str) -> list[BatchRecord]:
        return self._select(pipeline_id, lambda row: True)

    def committed_batches(self, pipeline_id: str) -> list[BatchRecord]:
        return self._select(pipeline_id, lambda row: row.state == BatchState.COMMITTED)

    # ------------------------------------------------------------------ plumbing

    def _fence(self, pipeline_id: str, interval: Interval | None, epoch: int) -> None:
        current = self.epoch(pipeline_id, interval)
        if current != epoch:
            holder = f"pipeline {pipeline_id!r}" + ("" if interval is None else f" interval {interval}")
            raise FencedError(f"{holder}: this attempt holds epoch {epoch} but a newer attempt took it "
                              f"(epoch {current}); this attempt stops without committing")

    def _claim(self, pipeline_id: str, owner: Owner | None, mode: str, sink: SinkRecord | None) -> dict[str, Any]:
        row = self.pipelines.get(pipeline_id) or {"epoch": 0, "owner": None, "mode": None, "sink": None}
        if owner and row["owner"] and row["owner"] != owner:
            raise PipelineConflictError(f"pipeline id {pipeline_id!r} belongs to {row['owner']}, not {owner}")
        if row["mode"] and row["mode"] != mode:
            raise PipelineConflictError(f"pipeline id {pipeline_id!r} ran in {row['mode']} mode, not {mode}")
        row["owner"], row["mode"] = row["owner"] or owner, row["mode"] or mode
        row["sink"] = sink or row.get("sink")  # the latest take's sink
        self.pipelines[pipeline_id] = row
        return row

    def _row(self, batch: BatchRecord) -> _BatchRow | None:
        return self.batches.get(batch.pipeline_id, {}).get(batch.batch_id)

    def _transition(self, batch: BatchRecord, target: BatchState) -> _BatchRow:
        """The checks of ``SqlOffsetStore._transition``: the caller's state, then the row's (``state IN``)."""
        if not can_transition(batch.state, target):
            raise CommitConflictError(f"batch {batch.batch_id} of {batch.pipeline_id!r} cannot go from "
                                      f"{batch.state.value} to {target.value}")
        row = self._row(batch)
        if row is None or not can_transition(row.state, target):
            raise CommitConflictError(f"batch {batch.batch_id} of {batch.pipeline_id!r} is no longer "
                                      f"{' or '.join(s.value for s in BatchState if can_transition(s, target))}; "
                                      "another attempt finished or aborted it")
        return row

    # ------------------------------------------------------------------ takes

    def store_identity(self) -> str:
        return "fake-store"

    def take_pipeline(self, pipeline_id: str, owner: Owner | None = None, sink: SinkRecord | None = None) -> int:
        row = self._claim(pipeline_id, owner, "continuous", sink)
        row["epoch"] += 1
        return int(row["epoch"])

    def take_interval(self, pipeline_id: str, interval: Interval, owner: Owner | None = None,
                      sink: SinkRecord | None = None) -> int:
        self._claim(pipeline_id, owner, "interval", sink)
        key = (pipeline_id, interval)
        self.intervals[key] = self.intervals.get(key, 0) + 1
        return self.intervals[key]

    # ------------------------------------------------------------------ reads

    def committed_offsets(self, pipeline_id: str) -> dict[TopicPartition, int]:
        return {tp: next_offset for tp, (next_offset, _) in self.offsets.get(pipeline_id, {}).items()}

    def _select(self, pipeline_id: str, where: Callable[[_BatchRow], bool]) -> list[BatchRecord]:
        return [row.record() for _, row in sorted(self.batches.get(pipeline_id, {}).items()) if where(row)]

    def batch_for_run(self, pipeline_id: str, run_id: str) -> BatchRecord | None:
        rows = self._select(pipeline_id, lambda row: row.run_key == run_id)
        return rows[0] if rows else None

    def unfinished_batches(self, pipeline_id: str) -> list[BatchRecord]:
        return self._select(pipeline_id, lambda row: row.state in UNFINISHED)

    def get_batch(self, pipeline_id: str, batch_id: int) -> BatchRecord | None:
        rows = self._select(pipeline_id, lambda row: row.batch_id == batch_id)
        return rows[0] if rows else None

    def batch_for_interval(self, pipeline_id: str, interval: Interval) -> BatchRecord | None:
        rows = self._select(pipeline_id, lambda row: row.interval == interval)
        return rows[0] if rows else None

    # ------------------------------------------------------------------ writes (fenced)

    def insert_batch(self, pipeline_id: str, epoch: int, run_id: str, ranges: list[OffsetRange],
                     skipped: list[OffsetRange], interval: Interval | None = None) -> BatchRecord:
        self._fence(pipeline_id, interval, epoch)
        rows = self.batches.setdefault(pipeline_id, {})
        batch_id = max(rows, default=-1) + 1
        run_key = run_id if interval is None else None  # continuous batches are unique per run ...
        for row in rows.values():
            if run_key is not None and row.run_key == run_key:
                raise DuplicateKeyError(f"Duplicate entry '{pipeline_id}-{run_key}' for key 'eo_batch_run'")
            if interval is not None and row.interval == interval:  # ... interval batches per interval
                raise DuplicateKeyError(f"Duplicate entry '{pipeline_id}-{interval}' for key 'eo_batch_interval'")
        rows[batch_id] = _BatchRow(pipeline_id, batch_id, run_id, run_key, interval, epoch, BatchState.PLANNED,
                                   sorted(ranges), sorted(skipped))
        return BatchRecord(pipeline_id, batch_id, run_id, epoch, BatchState.PLANNED, sorted(ranges), sorted(skipped),
                           interval=interval)

    def adopt_batch(self, batch: BatchRecord, epoch: int) -> BatchRecord:
        self._fence(batch.pipeline_id, batch.interval, epoch)
        row = self._row(batch)
        if row is None or row.state not in UNFINISHED:
            raise CommitConflictError(f"batch {batch.batch_id} of {batch.pipeline_id!r} changed "
                                      "while this attempt resumed it")
        row.epoch, row.state, row.xids = epoch, BatchState.PLANNED, None
        return BatchRecord(batch.pipeline_id, batch.batch_id, batch.run_id, epoch, BatchState.PLANNED,
                           batch.ranges, batch.skipped, interval=batch.interval)

    def mark_prepared(self, batch: BatchRecord, epoch: int, xids: list[str]) -> None:
        self._fence(batch.pipeline_id, batch.interval, epoch)
        row = self._transition(batch, BatchState.PREPARED)
        row.state, row.epoch, row.xids = BatchState.PREPARED, epoch, list(xids)

    def abort_batch(self, batch: BatchRecord, epoch: int) -> None:
        self._fence(batch.pipeline_id, batch.interval, epoch)
        row = self._transition(batch, BatchState.ABORTED)
        row.state, row.epoch, row.run_key = BatchState.ABORTED, epoch, None  # frees the run

    def commit_batch(self, batch: BatchRecord, epoch: int, summary: BatchSummary) -> None:
        """THE commit point: CAS every partition's offset and the batch state, all or nothing."""
        self._fence(batch.pipeline_id, batch.interval, epoch)
        offsets = self.offsets.setdefault(batch.pipeline_id, {})
        starts = batch_starts(batch.ranges, batch.skipped)
        moved: dict[TopicPartition, tuple[int, int]] = {}
        for r in batch.ranges if batch.interval is None else ():  # interval batches have no running position
            current = offsets.get(r.key)
            if current is not None and current[0] != starts[r.key]:
                raise CommitConflictError(f"{r.topic}[{r.partition}] is committed at offset {current[0]}, but batch "
                                          f"{batch.batch_id} starts at {starts[r.key]}; another run moved the offsets")
            moved[r.key] = (r.until_offset, batch.batch_id)
        row = self._transition(batch, BatchState.COMMITTED)
        offsets.update(moved)
        row.state, row.epoch, row.summary = BatchState.COMMITTED, epoch, _as_stored(summary)

    def record_replay(self, batch: BatchRecord, epoch: int, summary: BatchSummary) -> None:
        assert batch.interval is not None
        self._fence(batch.pipeline_id, batch.interval, epoch)
        row = self._row(batch)
        if row is None or row.state != BatchState.COMMITTED:
            raise CommitConflictError(f"batch {batch.batch_id} of {batch.pipeline_id!r} is no longer committed")
        row.epoch, row.summary = epoch, _as_stored(summary)
