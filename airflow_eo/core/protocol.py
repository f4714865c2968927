"""The exactly-once commit protocol of one micro-batch (``docs/architecture.md``, "The protocol").

One call of :func:`run_batch` is one task attempt:

1. **Take** the pipeline: ``epoch += 1``. Every later store write of this attempt is
   conditional on that epoch, so an older attempt still running (a zombie) can no
   longer commit.
2. **Recover** (:func:`recover_pipeline`, also what ``airflow eo recover`` runs): resolve
   the sink's leftovers (prepared XA branches: commit those of committed batches, roll
   back the rest) and unfinished batches: this run's own unfinished batch is resumed with
   its recorded ranges; another run's is aborted. A run that already committed returns
   its recorded summary and does nothing.
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
the engine and the sink are injected (see the Protocol classes below; the data they pass,
the write plan included, is :mod:`airflow_eo.core.batch`'s); ``tests/core/
test_protocol.py`` drives every branch with in-memory fakes of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Protocol

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.batch import (
    BatchContext,
    BatchRecord,
    BatchStart,
    BatchSummary,
    DeadLetter,
    ExecutionResult,
    Owner,
    RunRequest,
    WritePlan,
    WriteResult,
)
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.planning import (
    Interval,
    IntervalOffsets,
    PartitionOffsets,
    check_replayable,
    plan_batch,
    plan_interval,
)
from airflow_eo.core.ranges import OffsetRange, TopicPartition, check_contiguous
from airflow_eo.core.recovery import BatchAction, BatchDecision, BranchDecision, SinkRecovery, decide_unfinished

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the roles


class OffsetStore(Protocol):
    """The durable batch log and committed offsets; every write after a take is fenced by its epoch."""

    def store_identity(self) -> str:
        """An id the store made once for itself: two stores never share one (a sink database keeps which store's
        pipeline owns its rows of a pipeline id)."""
    def take_pipeline(self, pipeline_id: str, owner: Owner | None = None, sink: SinkRecord | None = None) -> int: ...
    def committed_offsets(self, pipeline_id: str) -> dict[TopicPartition, int]: ...
    def batch_for_run(self, pipeline_id: str, run_id: str) -> BatchRecord | None: ...
    def unfinished_batches(self, pipeline_id: str) -> list[BatchRecord]: ...
    def get_batch(self, pipeline_id: str, batch_id: int) -> BatchRecord | None: ...
    def insert_batch(self, pipeline_id: str, epoch: int, run_id: str, ranges: list[OffsetRange],
                     skipped: list[OffsetRange], interval: Interval | None = None) -> BatchRecord: ...
    def adopt_batch(self, batch: BatchRecord, epoch: int) -> BatchRecord: ...
    def mark_prepared(self, batch: BatchRecord, epoch: int, xids: list[str]) -> None: ...
    def commit_batch(self, batch: BatchRecord, epoch: int, summary: BatchSummary) -> None: ...
    def abort_batch(self, batch: BatchRecord, epoch: int) -> None: ...
    # interval mode
    def take_interval(self, pipeline_id: str, interval: Interval, owner: Owner | None = None,
                      sink: SinkRecord | None = None) -> int: ...
    def batch_for_interval(self, pipeline_id: str, interval: Interval) -> BatchRecord | None: ...
    def record_replay(self, batch: BatchRecord, epoch: int, summary: BatchSummary) -> None: ...


class OffsetSource(Protocol):
    """What the broker says about the pipeline's partitions (planning input)."""

    def partition_offsets(self, topics: Sequence[str], starting_offsets: str | int) -> list[PartitionOffsets]: ...
    def interval_offsets(self, topics: Sequence[str], interval: Interval) -> list[IntervalOffsets]: ...


class Sink(Protocol):
    """A sink's run-time adapter: everything the protocol and the engine call on it.

    A sink kind's factory builds one from its spec and connections (:mod:`airflow_eo.core.sink_kinds`).
    """

    name: str

    @property
    def capabilities(self) -> SinkCapabilities:
        """Its kind's, as registered (:class:`~airflow_eo.core.sink_kinds.KindAdapter`): whether it owns the commit
        point, whether its writes are visible before it, and the abilities whose roles the engine and ``airflow eo``
        ask for (:func:`~airflow_eo.core.abilities.role`)."""

    def check(self) -> None:
        """Misconfiguration (missing table, unsupported server) fails here, before any side effect."""
    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """Write the batch's output (``plan.output``, a DataFrame of the engine) invisibly (prepared) or
        replay-safely; executor-side sinks through ``plan.run_partitions`` (whose result they return)."""
    def can_hold_writes(self, out: Any) -> bool:
        """Whether this sink's partition writers can take in a whole partition of ``out`` (the output DataFrame)
        without making any of it visible and write it only when every partition agrees (``agreed``): a sink whose
        writes are visible before the commit point then needs one pass, not a first one to find bad records."""
    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        """Write bad records atomically with the batch (an iterator: there may be more than fit in memory); return
        the xids of prepared branches."""
    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord]) -> SinkRecovery:
        """Resolve leftovers (in-doubt branches, :func:`~airflow_eo.core.recovery.decide_branch`); return the
        decisions taken and the ids of unfinished batches the sink already committed."""
    def commit(self, batch: BatchRecord) -> None:
        """The commit point when ``owns_commit_point``; nothing otherwise."""
    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        """After the commit point: make the prepared output visible (XA COMMIT), drop strays."""
    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        """Best effort on failure before the commit point: roll back what this attempt (``batch.epoch``)
        prepared or opened, reported in ``xids`` or not (a failed Spark job reports nothing)."""
    def close(self) -> None:
        """Close what the adapter keeps open in this process between its calls (the driver's connections); its next
        call opens anew."""


class Engine(Protocol):
    """Reads a batch's exact ranges, transforms them and writes them through the sink."""

    def check(self) -> None:
        """Fail before any side effect when the engine cannot be reached (cheap checks only: an empty
        batch must not pay for starting Spark)."""
    def execute(self, batch: BatchContext, sink: Sink) -> ExecutionResult: ...


# --------------------------------------------------------------------------- the protocol


def run_batch(request: RunRequest, store: OffsetStore, source: OffsetSource, engine: Engine,
              sink: Sink) -> BatchSummary:
    """Run one task attempt of the pipeline's micro-batch (steps 1-6 above); returns its summary."""
    if request.interval is not None:
        return run_interval_batch(request, store, source, engine, sink)
    p = request.pipeline_id
    started = time.monotonic()
    engine.check()  # misconfiguration fails before any side effect
    sink.check()

    # 1. Take the pipeline: a new epoch fences every older attempt.
    epoch = store.take_pipeline(p, request.owner, sink=request.sink)
    log.info("pipeline %s taken with epoch %d (run %s)", p, epoch, request.run_id)
    attempt = Attempt(request, store, engine, sink, epoch, started)

    # 2. Recover (``airflow eo recover`` runs the same function, with no run of its own).
    recovery = recover_pipeline(store, sink, p, epoch, request.run_id)
    if recovery.already_committed is not None:
        done = recovery.already_committed
        log.info("run %s already committed batch %d; nothing to do", request.run_id, done.batch_id)
        recorded = done.summary or BatchSummary.of(done, done.run_id, done.epoch)
        return replace(recorded, already_committed=True)
    resumed = recovery.resume

    # 3. Plan (or resume) and write the batch row before reading any data.
    if resumed is not None:
        batch = store.adopt_batch(resumed, epoch)
        log.info("resuming batch %d with its recorded ranges: %s", batch.batch_id, _fmt(batch.ranges))
        return attempt.execute_and_commit(batch, BatchStart.RESUMED)
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
    # 4.-6. Execute, commit point, finalize.
    return attempt.execute_and_commit(batch, BatchStart.PLANNED)


@dataclass(frozen=True)
class Recovery:
    """What step 2 (:func:`recover_pipeline`) did and found, with every decision it applied and why (``airflow eo
    recover`` prints these)."""

    rolled_forward: tuple[int, ...] = ()  # batches the sink had committed, now recorded by the store
    aborted: tuple[int, ...] = ()  # other runs' unfinished batches, aborted (their branches rolled back)
    already_committed: BatchRecord | None = None  # the run's own batch, committed before (a clear)
    resume: BatchRecord | None = None  # the run's own unfinished batch, to resume with its recorded ranges
    branches: tuple[BranchDecision, ...] = field(default=(), compare=False)  # the sink's in-doubt branches
    batches: tuple[BatchDecision, ...] = field(default=(), compare=False)  # every unfinished batch's


def recover_pipeline(store: OffsetStore, sink: Sink, pipeline_id: str, epoch: int,
                     run_id: str | None = None) -> Recovery:
    """Step 2 of :func:`run_batch`: resolve what earlier attempts left, under the caller's freshly taken epoch.

    The sink resolves its leftovers (two-phase branches: committed when their batch committed and recorded them,
    else rolled back, :func:`airflow_eo.core.recovery.decide_branch`; a sink that owns its commit point names the
    unfinished batches it committed, which the store then records: rolled forward). Then, for a task attempt of
    run ``run_id``: if the run already committed, stop there (a clear: nothing else is touched); the run's own
    unfinished batch is to be resumed; every other unfinished batch is aborted
    (:func:`airflow_eo.core.recovery.decide_unfinished`). ``airflow eo recover`` calls this with ``run_id=None``:
    every unfinished batch is then another run's, and aborted.

    :param store: the offset store.
    :param sink: the pipeline's sink adapter.
    :param pipeline_id: the pipeline.
    :param epoch: the epoch the caller took (every store write here is fenced by it).
    :param run_id: the run of the calling task attempt; None for ``airflow eo recover`` (no run of its own).
    """
    p = pipeline_id
    unfinished = store.unfinished_batches(p)
    by_sink = sink.recover(p, lambda batch_id: store.get_batch(p, batch_id), unfinished)
    decisions: list[BatchDecision] = []
    rolled_forward = []
    for batch in unfinished:
        action, reason = decide_unfinished(batch, by_sink.committed, run_id)
        if action is BatchAction.ROLL_FORWARD:  # the sink's commit point passed, the mirror did not
            store.commit_batch(batch, epoch, BatchSummary.of(batch, batch.run_id, epoch, rolled_forward=True))
            rolled_forward.append(batch.batch_id)
            decisions.append(BatchDecision(batch.batch_id, batch.run_id, action, reason))
    if run_id is not None:
        done = store.batch_for_run(p, run_id)
        if done is not None and done.state == BatchState.COMMITTED:
            return Recovery(tuple(rolled_forward), already_committed=done, branches=by_sink.branches,
                            batches=tuple(decisions))

    resumed: BatchRecord | None = None
    aborted = []
    # Read again after the roll-forwards; none unfinished before stays none: ``epoch`` fences every other writer.
    for unfinished_batch in store.unfinished_batches(p) if unfinished else []:
        action, reason = decide_unfinished(unfinished_batch, frozenset(), run_id)
        decisions.append(BatchDecision(unfinished_batch.batch_id, unfinished_batch.run_id, action, reason))
        if action is BatchAction.RESUME:
            resumed = unfinished_batch
        else:
            log.warning("aborting batch %d left unfinished by run %s", unfinished_batch.batch_id,
                        unfinished_batch.run_id)
            store.abort_batch(unfinished_batch, epoch)
            aborted.append(unfinished_batch.batch_id)
    return Recovery(tuple(rolled_forward), tuple(aborted), resume=resumed, branches=by_sink.branches,
                    batches=tuple(decisions))


def run_interval_batch(request: RunRequest, store: OffsetStore, source: OffsetSource, engine: Engine,
                       sink: Sink) -> BatchSummary:
    """Run one task attempt of the batch of ``request.interval`` (interval mode).

    Only replay-safe sinks may run here; :func:`airflow_eo.core.config.check_pipeline` refuses
    the others when the DAG is parsed.
    """
    p, interval = request.pipeline_id, request.interval
    if interval is None:
        raise ConfigurationError("interval mode needs the run's data interval")
    started = time.monotonic()
    engine.check()
    sink.check()

    # 1. Take the interval: fences older attempts of THIS interval only.
    epoch = store.take_interval(p, interval, request.owner, sink=request.sink)
    log.info("pipeline %s interval %s taken with epoch %d (run %s)", p, interval, epoch, request.run_id)
    attempt = Attempt(request, store, engine, sink, epoch, started)

    # 2. Recover: the interval's batch decides; committed → replay, unfinished → resume.
    existing = store.batch_for_interval(p, interval)
    if existing is not None and existing.state == BatchState.COMMITTED:
        # Cleared or backfilled again: the same ranges again; an overwriting sink ends up unchanged.
        check_replayable(source.interval_offsets(request.topics, interval), existing.ranges)
        log.info("interval %s was committed as batch %d; replaying its recorded ranges: %s",
                 interval, existing.batch_id, _fmt(existing.ranges))
        return attempt.execute_and_commit(existing, BatchStart.REPLAY)
    if existing is not None:  # unfinished by an earlier attempt (of any run) of this interval
        batch = store.adopt_batch(existing, epoch)
        log.info("resuming batch %d of interval %s with its recorded ranges: %s",
                 batch.batch_id, interval, _fmt(batch.ranges))
        return attempt.execute_and_commit(batch, BatchStart.RESUMED)

    # 3. Plan the interval and write the batch row before reading any data.
    plan = plan_interval(source.interval_offsets(request.topics, interval), interval,
                         idle_timeout=request.idle_partition_timeout, now=datetime.now(timezone.utc))
    batch = store.insert_batch(p, epoch, request.run_id, plan.ranges, [], interval=interval)
    log.info("planned batch %d for interval %s: %s", batch.batch_id, interval, _fmt(batch.ranges))
    # 4.-6. Execute, commit point (or replay record), finalize.
    return attempt.execute_and_commit(batch, BatchStart.PLANNED)


@dataclass
class Attempt:
    """One task attempt's hold on its batch: the epoch it took and the roles it runs with (steps 4-6)."""

    request: RunRequest
    store: OffsetStore
    engine: Engine
    sink: Sink
    epoch: int
    started: float  # monotonic clock at the attempt's start

    def execute_and_commit(self, batch: BatchRecord, start: BatchStart) -> BatchSummary:
        """Steps 4-6: execute the batch, pass the commit point, finalize the sink."""
        store, sink, epoch = self.store, self.sink, self.epoch
        planned = time.monotonic()
        failpoint("after_plan")

        context = BatchContext(batch.pipeline_id, batch.batch_id, self.request.run_id, epoch, tuple(batch.ranges),
                               batch.interval, store.store_identity())
        result = ExecutionResult()
        storing = False  # set once the store's commit point is called: its outcome may then be unknown
        try:
            # 4. Execute: nothing to read, nothing to start.
            if all(r.size == 0 for r in batch.ranges):
                log.info("batch %d is empty: committing offsets without starting Spark", batch.batch_id)
            else:
                result = self.engine.execute(context, sink)
            executed = time.monotonic()
            if result.xids:  # prepared branches are recorded before the commit point
                store.mark_prepared(batch, epoch, result.xids)
                failpoint("after_prepare")
            seconds = {**result.seconds, "plan": round(planned - self.started, 3),
                       "execute": round(executed - planned, 3)}
            summary = BatchSummary.of(batch, self.request.run_id, epoch, replace(result, seconds=seconds),
                                      resumed=start is BatchStart.RESUMED, replayed=start is BatchStart.REPLAY)
            # 5. The commit point.
            if start is BatchStart.REPLAY:
                storing = True
                store.record_replay(batch, epoch, summary)  # the batch stays committed; its summary is updated
            else:
                if sink.capabilities.owns_commit_point:
                    sink.commit(batch)  # THE commit point (Kafka transaction with the offsets) ...
                storing = True
                store.commit_batch(batch, epoch, summary)  # ... else this is THE commit point
        except BaseException as exc:
            # Best effort, and only what this attempt made (a newer attempt's branches are not ours
            # to touch); the next attempt's recovery resolves whatever is left. Not once the store's
            # commit was called: an error there (a lost acknowledgement) may follow a commit that took
            # effect, and rolling back the branches of a committed batch would lose it.
            if not storing:
                sink.discard(context, result.xids)
            _explain(exc, batch, "at its commit point" if storing else "before its commit point")
            raise
        committed_at = time.monotonic()
        log.info("batch %d %s: %d records in, %d rows out, %d dead letters", batch.batch_id,
                 "replayed" if start is BatchStart.REPLAY else "committed", result.records_in, result.rows_out,
                 result.dead_letters)
        failpoint("after_commit_point")

        # 6. Finalize the sink; a crash here is finished by the next attempt's recovery.
        try:
            sink.finalize(batch, result.xids)
        except Exception as exc:
            _explain(exc, batch, "after its commit point")
            raise
        return replace(summary, seconds={**summary.seconds, "commit": round(committed_at - executed, 3),
                                         "finalize": round(time.monotonic() - committed_at, 3)})


_NEXT = {
    "before its commit point": "nothing of it is committed; the next attempt (a retry, or the next run) "
                               "runs the same ranges again",
    "at its commit point": "whether the commit took effect is unknown (the acknowledgement was lost); the next "
                           "attempt's recovery reads the offset store and either finishes the batch or runs it again",
    "after its commit point": "it is committed; the next attempt's recovery finishes the sink's commit (XA COMMIT "
                              "of the batch's prepared branches), nothing is read or written twice",
}


def _explain(exc: BaseException, batch: BatchRecord, where: str) -> None:
    """Say on the error (a note in its traceback, its type unchanged) where the batch stands and what the
    next attempt does: the message of a lost database or broker names only the lost connection."""
    if isinstance(exc, Exception) and hasattr(exc, "add_note"):  # notes: Python >= 3.11
        exc.add_note(f"airflow_eo: batch {batch.batch_id} of pipeline {batch.pipeline_id!r} failed {where}: "
                     f"{_NEXT[where]}.")


def _fmt(ranges: Sequence[OffsetRange]) -> str:
    return ", ".join(str(r) for r in ranges) or "(no partitions)"
