"""The exactly-once commit protocol of one micro-batch (DESIGN §2, §5).

One call of :func:`run_batch` is one task attempt:

1. **Take** the pipeline: ``epoch += 1``. Every later store write of this attempt is
   conditional on that epoch, so an older attempt still running (a zombie) can no
   longer commit.
2. **Recover**: resolve the sink's leftovers (prepared XA branches: commit those of
   committed batches, roll back the rest) and unfinished batches: this run's own
   unfinished batch is resumed with its recorded ranges; another run's is aborted.
   A run that already committed returns its recorded summary and does nothing.
3. **Plan** the ranges and write the batch row (``planned``) BEFORE reading data.
4. **Execute** on the engine (Spark): read exactly the ranges, transform, write.
   Transactional sinks prepare their branches and report xids; the store records
   them (``prepared``).
5. **Commit point**: ONE store transaction moves every partition's offset with a
   compare-and-set and marks the batch committed. Before it, nothing of this batch
   counts; after it, the batch is done, whatever crashes next. (A Kafka transactional
   sink commits its transaction, offsets included, first: that is the commit point and
   the store mirrors it; recovery rolls the store forward when only Kafka got there.)
6. **Finalize** the sink (``XA COMMIT`` of the recorded xids, roll back strays). A
   crash here is finished by the next attempt's recovery (step 2).

**Interval mode** (:func:`run_interval_batch`, for backfills): the batch identity is the
run's data interval. Its ranges come from ``offsets_for_times`` of the interval's two
ends; the fencing epoch belongs to the interval, so a backfill's concurrent runs of
different intervals never fence each other; a cleared or re-backfilled interval replays
its recorded ranges, which only replay-safe (overwriting) sinks allow.

This module knows no Airflow, Spark, Kafka or MySQL: the store, the offset source,
the engine and the sink are injected (see the Protocol classes below).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.faults import crash_if
from airflow_eo.core.planning import (
    Interval,
    IntervalOffsets,
    PartitionOffsets,
    check_replayable,
    plan_batch,
    plan_interval,
)
from airflow_eo.core.ranges import OffsetRange, TopicPartition, check_contiguous
from airflow_eo.core.states import BatchState

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class BatchRecord:
    """One row of the batch log."""

    pipeline_id: str
    batch_id: int
    run_id: str
    epoch: int
    state: BatchState
    ranges: list[OffsetRange]
    skipped: list[OffsetRange] = field(default_factory=list)
    xids: list[str] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    interval: Interval | None = None  # interval mode: the batch's identity


@dataclass(frozen=True)
class BatchContext:
    """What a transform (and a sink) may know about the batch it processes."""

    pipeline_id: str
    batch_id: int
    run_id: str
    epoch: int
    ranges: tuple[OffsetRange, ...]
    interval: Interval | None = None


@dataclass
class ExecutionResult:
    records_in: int = 0
    rows_out: int = 0
    dead_letters: int = 0
    xids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRequest:
    pipeline_id: str
    run_id: str
    topics: Sequence[str]
    starting_offsets: str | int = "earliest"  # earliest | latest | epoch millis
    max_records_per_run: int | None = None
    skip_lost_records: bool = False
    interval: Interval | None = None  # set: interval mode (the run's data interval)
    idle_partition_timeout: timedelta | None = None  # interval mode: when an idle partition's end may be closed
    owner: str | None = None  # who declares the pipeline (``<dag_id>.<task_id>``); a second owner is refused


# --------------------------------------------------------------------------- adapters


class OffsetStore(Protocol):
    def take_pipeline(self, pipeline_id: str, owner: str | None = None) -> int: ...
    def committed_offsets(self, pipeline_id: str) -> dict[TopicPartition, int]: ...
    def batch_for_run(self, pipeline_id: str, run_id: str) -> BatchRecord | None: ...
    def unfinished_batches(self, pipeline_id: str) -> list[BatchRecord]: ...
    def get_batch(self, pipeline_id: str, batch_id: int) -> BatchRecord | None: ...
    def insert_batch(self, pipeline_id: str, epoch: int, run_id: str, ranges: list[OffsetRange],
                     skipped: list[OffsetRange], interval: Interval | None = None) -> BatchRecord: ...
    def adopt_batch(self, batch: BatchRecord, epoch: int) -> BatchRecord: ...
    def mark_prepared(self, batch: BatchRecord, epoch: int, xids: list[str]) -> None: ...
    def commit_batch(self, batch: BatchRecord, epoch: int, summary: dict[str, Any]) -> None: ...
    def abort_batch(self, batch: BatchRecord, epoch: int) -> None: ...
    # interval mode
    def take_interval(self, pipeline_id: str, interval: Interval, owner: str | None = None) -> int: ...
    def batch_for_interval(self, pipeline_id: str, interval: Interval) -> BatchRecord | None: ...
    def record_replay(self, batch: BatchRecord, epoch: int, summary: dict[str, Any]) -> None: ...


class OffsetSource(Protocol):
    def partition_offsets(self, topics: Sequence[str], starting_offsets: str | int) -> list[PartitionOffsets]: ...
    def interval_offsets(self, topics: Sequence[str], interval: Interval) -> list[IntervalOffsets]: ...


class Sink(Protocol):
    #: True when output stays invisible until the batch commits (XA, Kafka transactions);
    #: False when the writes themselves are visible and replay-safe (upsert).
    transactional: bool
    #: True when the sink's own commit is the commit point (Kafka transactions carry the
    #: offsets); the store then mirrors it. False: the store's commit is the commit point.
    owns_commit_point: bool

    def check(self) -> None: ...
    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord]) -> set[int]:
        """Resolve leftovers; return the ids of unfinished batches the sink already committed."""
    def commit(self, batch: BatchRecord) -> None: ...
    def finalize(self, pipeline_id: str, batch: BatchRecord, xids: Sequence[str]) -> None: ...
    def discard(self, xids: Sequence[str]) -> None: ...


class Engine(Protocol):
    def execute(self, batch: BatchContext, sink: Sink) -> ExecutionResult: ...


# --------------------------------------------------------------------------- the protocol


def run_batch(request: RunRequest, store: OffsetStore, source: OffsetSource, engine: Engine,
              sink: Sink) -> dict[str, Any]:
    """Run one task attempt of the pipeline's micro-batch; returns the batch summary."""
    if request.interval is not None:
        return run_interval_batch(request, store, source, engine, sink)
    p = request.pipeline_id
    started = time.monotonic()
    sink.check()  # misconfiguration fails before any side effect

    epoch = store.take_pipeline(p, request.owner)
    log.info("pipeline %s taken with epoch %d (run %s)", p, epoch, request.run_id)

    unfinished = store.unfinished_batches(p)
    committed_by_sink = sink.recover(p, lambda batch_id: store.get_batch(p, batch_id), unfinished)
    for batch in unfinished:
        if batch.batch_id in committed_by_sink:  # the sink's commit point passed, the mirror did not
            store.commit_batch(batch, epoch, _summary(request, batch, epoch, ExecutionResult(), False)
                               | {"run_id": batch.run_id, "rolled_forward": True})
    done = store.batch_for_run(p, request.run_id)
    if done is not None and done.state == BatchState.COMMITTED:
        log.info("run %s already committed batch %d; nothing to do", request.run_id, done.batch_id)
        return {**(done.summary or {}), "already_committed": True}

    resumed: BatchRecord | None = None
    for unfinished in store.unfinished_batches(p):
        if unfinished.run_id == request.run_id:
            resumed = unfinished
        else:
            log.warning("aborting batch %d left unfinished by run %s", unfinished.batch_id, unfinished.run_id)
            store.abort_batch(unfinished, epoch)

    if resumed is not None:
        batch = store.adopt_batch(resumed, epoch)
        log.info("resuming batch %d with its recorded ranges: %s", batch.batch_id, _fmt(batch.ranges))
    else:
        committed = store.committed_offsets(p)
        plan = plan_batch(
            source.partition_offsets(request.topics, request.starting_offsets),
            committed,
            max_records_per_run=request.max_records_per_run,
            skip_lost_records=request.skip_lost_records,
        )
        check_contiguous(committed, plan.ranges, plan.skipped)
        batch = store.insert_batch(p, epoch, request.run_id, plan.ranges, plan.skipped)
        log.info("planned batch %d: %s", batch.batch_id, _fmt(batch.ranges))
        if plan.skipped:
            log.warning("batch %d skips records lost to retention: %s", batch.batch_id, _fmt(plan.skipped))
    return _execute_and_commit(request, store, engine, sink, batch, epoch, started, resumed=resumed is not None)


def run_interval_batch(request: RunRequest, store: OffsetStore, source: OffsetSource, engine: Engine,
                       sink: Sink) -> dict[str, Any]:
    """Run one task attempt of the batch of ``request.interval`` (interval mode)."""
    p, interval = request.pipeline_id, request.interval
    if interval is None:
        raise ConfigurationError("interval mode needs the run's data interval")
    if sink.transactional:  # the operator refuses these at parse time; this guards the core itself
        raise ConfigurationError("interval mode replays intervals: it needs a replay-safe, non-transactional sink")
    started = time.monotonic()
    sink.check()

    epoch = store.take_interval(p, interval, request.owner)  # fences older attempts of THIS interval only
    log.info("pipeline %s interval %s taken with epoch %d (run %s)", p, interval, epoch, request.run_id)

    existing = store.batch_for_interval(p, interval)
    if existing is not None and existing.state == BatchState.COMMITTED:
        # Cleared or backfilled again: the same ranges again; an overwriting sink ends up unchanged.
        check_replayable(source.interval_offsets(request.topics, interval), existing.ranges)
        log.info("interval %s was committed as batch %d; replaying its recorded ranges: %s",
                 interval, existing.batch_id, _fmt(existing.ranges))
        return _execute_and_commit(request, store, engine, sink, existing, epoch, started, replay=True)
    if existing is not None:  # unfinished by an earlier attempt (of any run) of this interval
        batch = store.adopt_batch(existing, epoch)
        log.info("resuming batch %d of interval %s with its recorded ranges: %s",
                 batch.batch_id, interval, _fmt(batch.ranges))
    else:
        plan = plan_interval(source.interval_offsets(request.topics, interval), interval,
                             idle_timeout=request.idle_partition_timeout, now=datetime.now(timezone.utc))
        batch = store.insert_batch(p, epoch, request.run_id, plan.ranges, [], interval=interval)
        log.info("planned batch %d for interval %s: %s", batch.batch_id, interval, _fmt(batch.ranges))
    return _execute_and_commit(request, store, engine, sink, batch, epoch, started, resumed=existing is not None)


def _execute_and_commit(request: RunRequest, store: OffsetStore, engine: Engine, sink: Sink, batch: BatchRecord,
                        epoch: int, started: float, resumed: bool = False, replay: bool = False) -> dict[str, Any]:
    """Steps 4-6: execute the planned batch, pass the commit point, finalize the sink."""
    p = request.pipeline_id
    planned = time.monotonic()
    crash_if("after_plan")

    context = BatchContext(p, batch.batch_id, request.run_id, epoch, tuple(batch.ranges), batch.interval)
    result = ExecutionResult()
    try:
        if all(r.size == 0 for r in batch.ranges):
            log.info("batch %d is empty: committing offsets without starting Spark", batch.batch_id)
        else:
            result = engine.execute(context, sink)
        executed = time.monotonic()
        if sink.transactional and result.xids:
            store.mark_prepared(batch, epoch, result.xids)
            crash_if("after_prepare")
        summary = _summary(request, batch, epoch, result, resumed)
        summary["replayed"] = replay
        summary["seconds"].update(plan=round(planned - started, 3), execute=round(executed - planned, 3))
        if replay:
            store.record_replay(batch, epoch, summary)  # the batch stays committed; its summary is updated
        else:
            if sink.owns_commit_point:
                sink.commit(batch)  # THE commit point (Kafka transaction with the offsets) ...
            store.commit_batch(batch, epoch, summary)  # ... else this is THE commit point
    except BaseException:
        # Best effort, and only what this attempt made (a newer attempt's branches are not ours
        # to touch); the next attempt's recovery resolves whatever is left.
        sink.discard(result.xids)
        raise
    committed_at = time.monotonic()
    log.info("batch %d %s: %d records in, %d rows out, %d dead letters", batch.batch_id,
             "replayed" if replay else "committed", result.records_in, result.rows_out, result.dead_letters)
    crash_if("after_commit_point")

    sink.finalize(p, batch, result.xids)
    summary["seconds"].update(commit=round(committed_at - executed, 3),
                              finalize=round(time.monotonic() - committed_at, 3))
    return summary


def _summary(request: RunRequest, batch: BatchRecord, epoch: int, result: ExecutionResult,
             resumed: bool) -> dict[str, Any]:
    return {
        "pipeline_id": request.pipeline_id,
        "batch_id": batch.batch_id,
        "run_id": request.run_id,
        "epoch": epoch,
        "ranges": [_range_dict(r) for r in batch.ranges],
        "skipped": [_range_dict(r) for r in batch.skipped],
        "records_in": result.records_in,
        "rows_out": result.rows_out,
        "dead_letters": result.dead_letters,
        "resumed": resumed,
        "already_committed": False,
        "mode": "continuous" if batch.interval is None else "interval",
        "interval": None if batch.interval is None else {"start": batch.interval.start.isoformat(),
                                                         "end": batch.interval.end.isoformat()},
        "seconds": dict(result.seconds),
    }


def _range_dict(r: OffsetRange) -> Mapping[str, Any]:
    return {"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset,
            "until_offset": r.until_offset}


def _fmt(ranges: Sequence[OffsetRange]) -> str:
    return ", ".join(str(r) for r in ranges) or "(no partitions)"
