"""In-memory fakes of the roles of the commit protocol (``airflow_eo.core.protocol``) for ``test_protocol.py``.

- :class:`FakeStore` copies :class:`airflow_eo.mysql.store.MySqlOffsetStore`: every write after a
  take is fenced by the attempt's epoch (the pipeline's, or in interval mode the interval's), the commit point
  is one atomic compare-and-set of every partition's offset plus the batch state, transitions follow
  ``core.states``, ``adopt_batch`` resets a batch to ``planned`` and drops its xids, ``abort_batch`` frees
  the run (``run_key`` NULL), batch ids are ``MAX + 1``, a run has one batch (continuous mode) and an interval
  one batch (interval mode).
- :class:`FakeSource` is the input topic: per partition a list of records with timestamps.
- :class:`FakeEngine` reads exactly a batch's ranges from it and writes them through the sink (it is also
  the ``PartitionRunner``).
- Three sinks, each over a shared server whose state outlives the attempts: :class:`FakeXaSink` (prepared
  branches, invisible until committed after the commit point), :class:`FakeUpsertSink` (visible at once,
  idempotent per record key) and :class:`FakeKafkaSink` (its own commit is the commit point).

A :class:`Process` is the OS process of one task attempt. Every fake the attempt uses reports each of its
steps to it, and the process can be killed there (:class:`Killed`: like SIGKILL, nothing after it runs, no
cleanup either), fail there with an ordinary exception (cleanup runs), or pause there while other attempts
run to completion (so that it continues as a zombie).
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.batch import (
    BatchContext,
    BatchRecord,
    BatchSummary,
    DeadLetter,
    ExecutionResult,
    Owner,
    RunRequest,
    WritePlan,
    WriteResult,
)
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.errors import CommitConflictError, ConfigurationError, FencedError, PipelineConflictError
from airflow_eo.core.planning import Interval, IntervalOffsets, PartitionOffsets
from airflow_eo.core.protocol import run_batch
from airflow_eo.core.ranges import OffsetRange, TopicPartition, batch_starts
from airflow_eo.core.recovery import BranchAction, SinkRecovery, committed_by_kafka, decide_branch
from airflow_eo.core.states import UNFINISHED, BatchState, can_transition
from airflow_eo.core.xid import Xid, pipeline_key

RecordId = tuple[str, int, int]  # topic, partition, offset

# --------------------------------------------------------------------------- processes and faults


class Killed(BaseException):
    """The attempt's process was killed (SIGKILL) at a step: nothing after it runs, no cleanup either.

    A BaseException so that no ``except Exception`` catches it; the protocol's ``except BaseException``
    still does, which is why the fake sinks' ``discard`` does nothing in a killed process.
    """


class InjectedError(RuntimeError):
    """An ordinary failure at a step (a lost connection, a failed Spark job): cleanup code runs."""


class DuplicateKeyError(Exception):
    """What MySQL raises on a unique key (``pymysql.err.IntegrityError`` 1062)."""


class ProducerFencedError(Exception):
    """Kafka: a newer producer of the same ``transactional.id`` called ``init_transactions``."""


Trigger = int | str | tuple[str, int] | None  # the n-th step of the process | a step's name | (name, n-th time)


class Process:
    """The OS process of one task attempt: the steps it went through, and where it dies, fails or pauses.

    :param kill_at: the step where the process is killed (:class:`Killed`).
    :param fail_at: the step that raises :class:`InjectedError` (unless ``no_fail(step)``).
    :param pause_at: the step before which ``on_pause`` runs (e.g. whole newer attempts), once.
    """

    def __init__(self, *, kill_at: Trigger = None, fail_at: Trigger = None, pause_at: Trigger = None,
                 on_pause: Callable[[], None] | None = None, no_fail: Callable[[str], bool] | None = None) -> None:
        self.kill_at, self.fail_at, self.pause_at, self.on_pause = kill_at, fail_at, pause_at, on_pause
        self.no_fail = no_fail
        self.trace: list[str] = []
        self.dead = False
        self.epoch: int | None = None  # what the attempt's take returned
        self.engine: FakeEngine | None = None
        self.sink: Any = None
        self._seen: Counter[str] = Counter()

    def step(self, name: str) -> None:
        if self.dead:
            raise AssertionError(f"step {name!r} ran in a killed process (killed at {self.trace[-1]!r})")
        self.trace.append(name)
        self._seen[name] += 1
        if self.on_pause is not None and self._hit(self.pause_at, name):
            on_pause, self.on_pause = self.on_pause, None
            on_pause()
        if self._hit(self.kill_at, name):
            self.dead = True
            raise Killed(name)
        if self._hit(self.fail_at, name) and not (self.no_fail is not None and self.no_fail(name)):
            raise InjectedError(f"injected failure at {name}")

    def _hit(self, trigger: Trigger, name: str) -> bool:
        if trigger is None:
            return False
        if isinstance(trigger, int):
            return len(self.trace) == trigger
        if isinstance(trigger, str):
            return name == trigger and self._seen[name] == 1
        return name == trigger[0] and self._seen[name] == trigger[1]


#: The running attempts' processes, innermost last (a paused attempt runs newer attempts inside its pause).
RUNNING: list[Process] = []


def failpoint(point: str, scope: str = "") -> None:
    """Stands in for ``protocol.failpoint``: the protocol's failpoints are steps of the running process."""
    if RUNNING:
        RUNNING[-1].step(f"crash:{point}")


class _Stepped:
    """An attempt's handle on a shared fake: every call is a step of the attempt's process before it runs,
    and the writes (``writes``) are a step ``<name>:done`` again after they took effect."""

    def __init__(self, target: Any, proc: Process, prefix: str, writes: frozenset[str] = frozenset()) -> None:
        self._target, self._proc, self._prefix, self._writes = target, proc, prefix, writes

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._proc.step(f"{self._prefix}.{name}")
            result = attr(*args, **kwargs)
            if name.startswith("take_"):
                self._proc.epoch = result
            if name in self._writes:
                self._proc.step(f"{self._prefix}.{name}:done")
            return result

        return call


# --------------------------------------------------------------------------- the offset store


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
    """``OffsetStore`` in memory with the semantics of ``MySqlOffsetStore`` (each method is one transaction:
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
        """The checks of ``MySqlOffsetStore._transition``: the caller's state, then the row's (``state IN``)."""
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


# --------------------------------------------------------------------------- the input topic


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


# --------------------------------------------------------------------------- the engine


class FakeEngine:
    """``Engine`` (and ``PartitionRunner``): reads exactly the batch's ranges, hands the records to the sink.

    The output "DataFrame" is the list of records read (an identity transform); ``run_partitions`` splits it
    by the writer's key (``writer.key_of``, default the event id) into ``write_partitions`` partitions, like
    the repartition by ``key_columns`` before a Spark write.
    """

    def __init__(self, source: FakeSource, proc: Process, write_partitions: int = 2) -> None:
        self.source, self.proc, self.write_partitions = source, proc, write_partitions
        self.calls: list[BatchContext] = []

    def check(self) -> None:
        return None

    def execute(self, batch: BatchContext, sink: Any) -> ExecutionResult:
        self.calls.append(batch)
        self.proc.step("engine.read")
        out = [rec for r in batch.ranges if r.size for rec in self.source.read(r)]
        written = sink.write(WritePlan(out, self), batch)
        self.proc.step("engine.written")
        return ExecutionResult(records_in=len(out), rows_out=written.rows, xids=list(written.xids))

    def run_partitions(self, plan: WritePlan, writer: Callable[..., tuple[str | None, int]],
                       columns: Any = None) -> WriteResult:
        out: list[Record] = plan.output
        result = WriteResult()
        key_of = getattr(writer, "key_of", lambda rec: rec.key)
        for partition in range(self.write_partitions):  # the rows of one key in one partition, in offset order
            rows = [rec for rec in out if zlib.crc32(key_of(rec).encode()) % self.write_partitions == partition]
            xid, written = writer([rows], partition, 0, 0)
            if xid:
                result.xids.append(xid)
            result.rows += written
        return result


# --------------------------------------------------------------------------- the sinks


class _SinkBase:
    name = "fake"
    capabilities = SinkCapabilities()

    def __init__(self, proc: Process, check_error: Exception | None = None) -> None:
        self.proc, self.check_error = proc, check_error
        self.writes: list[BatchContext] = []

    def check(self) -> None:
        if self.check_error is not None:
            raise self.check_error

    def can_hold_writes(self, out: Any) -> bool:
        return False

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        assert next(records, None) is None
        return []

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        return SinkRecovery()

    def commit(self, batch: BatchRecord) -> None:
        return None

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        return None

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        return None


# -- XA


class XaServer:
    """The XA sink's database: prepared branches (invisible) and the committed output (visible)."""

    def __init__(self) -> None:
        self.prepared: dict[str, list[Record]] = {}
        self.committed: list[str] = []
        self.rolled_back: list[str] = []
        self.applied: Counter[RecordId] = Counter()  # record -> times its row became visible

    def prepare(self, xid: str, rows: list[Record]) -> None:
        if xid in self.prepared or xid in self.committed or xid in self.rolled_back:
            raise AssertionError(f"xid {xid} used twice")
        self.prepared[xid] = rows

    def end(self, xid: str, commit: bool) -> bool:
        """``XA COMMIT|ROLLBACK``; False when the server no longer knows the xid (``XAER_NOTA``)."""
        rows = self.prepared.pop(xid, None)
        if rows is None:
            return False
        if commit:
            self.committed.append(xid)
            self.applied.update(rec.id for rec in rows)
        else:
            self.rolled_back.append(xid)
        return True


@dataclass(frozen=True)
class _XaWriter:
    """Executor side: one partition's rows in one XA branch, prepared and reported."""

    server: XaServer
    proc: Process
    pipeline_key: str
    batch_id: int
    epoch: int

    @property
    def key_columns(self) -> tuple[str, ...]:
        return ("key",)

    def __call__(self, batches: Iterable[list[Record]], partition: int, stage_id: int,
                 attempt_id: int) -> tuple[str | None, int]:
        rows = [rec for batch in batches for rec in batch]
        if not rows:
            return None, 0  # nothing to write: no branch at all
        xid = Xid(self.pipeline_key, self.batch_id, self.epoch, partition, stage_id, attempt_id).encode()
        self.proc.step("xa.prepare")
        self.server.prepare(xid, rows)
        self.proc.step("xa.prepared")
        return xid, len(rows)


class FakeXaSink(_SinkBase):
    """Like ``MySqlXaAdapter``: a prepared branch per write partition; the store's commit is the commit point."""

    name = "fake_xa"
    capabilities = SinkCapabilities(accumulates=True, in_doubt_branches=True)

    def __init__(self, server: XaServer, proc: Process, check_error: Exception | None = None) -> None:
        super().__init__(proc, check_error)
        self.server = server
        self.discarded: list[list[str]] = []

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        self.writes.append(batch)
        return plan.run_partitions(_XaWriter(self.server, self.proc, pipeline_key(batch.pipeline_id),
                                                    batch.batch_id, batch.epoch))

    def _ours(self, pipeline_id: str) -> list[tuple[str, Xid]]:
        return [(text, xid) for text in sorted(self.server.prepared)
                if (xid := Xid.decode(text)).belongs_to(pipeline_id)]

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        """Commit the branches of committed batches that recorded their xid, roll back the rest."""
        records: dict[int, BatchRecord | None] = {}
        decisions = []
        for text, xid in self._ours(pipeline_id):
            if xid.batch_id not in records:
                records[xid.batch_id] = batch_lookup(xid.batch_id)
            # The real adapter's decision (MySqlXaAdapter.recover): the same function, not a copy.
            decision = decide_branch(xid, records[xid.batch_id])
            decisions.append(decision)
            self.proc.step("xa.recover")
            self.server.end(text, decision.action is BranchAction.COMMIT)
        return SinkRecovery(branches=tuple(decisions))  # the store's commit is the commit point

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        for text in xids:
            self.proc.step("xa.commit")
            self.server.end(text, True)
        for text, xid in self._ours(batch.pipeline_id):  # strays of this batch: prepared, never reported
            if xid.batch_id == batch.batch_id and text not in xids:
                self.proc.step("xa.rollback_stray")
                self.server.end(text, False)

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        """Like ``MySqlXaAdapter.discard``: the reported branches and this attempt's unreported ones."""
        # A real SIGKILL runs no cleanup. The fake stops a killed attempt with Killed, which the protocol's
        # ``except BaseException: sink.discard(...)`` also catches: in a killed process, discard does nothing.
        if self.proc.dead:
            return
        self.discarded.append(list(xids))
        mine = {text for text, xid in self._ours(batch.pipeline_id)
                if (xid.batch_id, xid.epoch) == (batch.batch_id, batch.epoch)}
        for text in sorted(set(xids) | mine):
            self.server.end(text, False)


# -- upsert


class UpsertTable:
    """The upsert sink's table: ``key -> value`` (what readers see), and how often each record was written.

    :param keys_per_partition: None: a record's key is its event id (unique); n: records share n keys per
        partition (``offset % n``), the last write of a key wins, so a late write can leave an older value.
    """

    def __init__(self, keys_per_partition: int | None = None) -> None:
        self.keys_per_partition = keys_per_partition
        self.rows: dict[str, str] = {}
        self.sources: dict[str, RecordId] = {}  # key -> the record whose value the row holds
        self.writes: Counter[RecordId] = Counter()

    def key_of(self, rec: Record) -> str:
        if self.keys_per_partition is None:
            return rec.key
        return f"{rec.topic}-{rec.partition}-key{rec.offset % self.keys_per_partition}"

    def expected(self, records: Iterable[Record]) -> dict[str, str]:
        """The table after every record was applied once, in offset order."""
        return {self.key_of(rec): rec.value for rec in sorted(records, key=lambda rec: rec.id)}


@dataclass(frozen=True)
class _UpsertWriter:
    table: UpsertTable
    proc: Process
    fence: Callable[[], None] | None  # the epoch check before each write, if the sink is fenced

    @property
    def key_columns(self) -> tuple[str, ...]:
        return ("key",)

    def key_of(self, rec: Record) -> str:
        return self.table.key_of(rec)

    def __call__(self, batches: Iterable[list[Record]], partition: int, stage_id: int,
                 attempt_id: int) -> tuple[str | None, int]:
        written = 0
        for rec in (rec for batch in batches for rec in batch):
            self.proc.step("upsert.row")  # each row is visible at once: a kill leaves a partial write
            if self.fence is not None:
                self.fence()
            key = self.table.key_of(rec)
            self.table.rows[key], self.table.sources[key] = rec.value, rec.id
            self.table.writes[rec.id] += 1
            written += 1
        return None, written


class FakeUpsertSink(_SinkBase):
    """Like ``MySqlUpsertAdapter``: every row is visible when written, and a replay rewrites the same rows.

    :param fenced_by: the store whose epoch each write checks first (``EpochFence``: the sink on the
        store's server); None: writes are not fenced, a zombie's late write lands.
    """

    name = "fake_upsert"
    capabilities = SinkCapabilities(writes_visible_before_commit=True, interval_replay=True)

    def __init__(self, table: UpsertTable, proc: Process, check_error: Exception | None = None,
                 fenced_by: FakeStore | None = None) -> None:
        super().__init__(proc, check_error)
        self.table, self.fenced_by = table, fenced_by

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        self.writes.append(batch)
        store = self.fenced_by
        fence = None if store is None else (lambda: store._fence(batch.pipeline_id, batch.interval, batch.epoch))
        return plan.run_partitions(_UpsertWriter(self.table, self.proc, fence))


# -- Kafka


@dataclass
class _Txn:
    producer_epoch: int
    records: list[Record] = field(default_factory=list)


class KafkaCluster:
    """The Kafka sink's cluster: the output topic's transactions (one ``transactional.id``: the pipeline's)
    and the pipeline's consumer group offsets, both made visible by one transaction commit."""

    def __init__(self) -> None:
        self.producer_epoch = 0
        self.open: _Txn | None = None
        self.output: list[Record] = []  # what read_committed consumers see
        self.aborted = 0
        self.group_offsets: dict[TopicPartition, int] = {}

    def init_transactions(self) -> int:
        """A new producer of the transactional id: fences the older one and aborts its open transaction."""
        self.producer_epoch += 1
        if self.open is not None:
            self.open, self.aborted = None, self.aborted + 1
        return self.producer_epoch

    def _txn(self, producer_epoch: int) -> _Txn:
        if producer_epoch != self.producer_epoch:
            raise ProducerFencedError(f"producer epoch {producer_epoch} was fenced by {self.producer_epoch}")
        if self.open is None:
            raise AssertionError("no open transaction")
        return self.open

    def begin(self, producer_epoch: int) -> None:
        if producer_epoch != self.producer_epoch:
            raise ProducerFencedError(f"producer epoch {producer_epoch} was fenced by {self.producer_epoch}")
        if self.open is not None:
            raise AssertionError("a transaction is already open")
        self.open = _Txn(producer_epoch)

    def produce(self, producer_epoch: int, rec: Record) -> None:
        self._txn(producer_epoch).records.append(rec)

    def commit(self, producer_epoch: int, positions: dict[TopicPartition, int]) -> None:
        txn = self._txn(producer_epoch)
        self.output.extend(txn.records)
        self.group_offsets.update(positions)
        self.open = None

    def abort(self, producer_epoch: int) -> None:
        self._txn(producer_epoch)
        self.open, self.aborted = None, self.aborted + 1


class FakeKafkaSink(_SinkBase):
    """Like ``KafkaTransactionalAdapter``: the output and the consumed offsets in one transaction, whose
    commit is the commit point; ``recover`` names the unfinished batches whose ends the group reached."""

    name = "fake_kafka"
    capabilities = SinkCapabilities(owns_commit_point=True, accumulates=True, appends=True, consumer_group=True)

    def __init__(self, cluster: KafkaCluster, proc: Process, check_error: Exception | None = None) -> None:
        super().__init__(proc, check_error)
        self.cluster = cluster
        self._epoch: int | None = None
        self._in_txn = False

    def _producer(self) -> int:
        if self._epoch is None:
            self.proc.step("kafka.init_transactions")
            self._epoch = self.cluster.init_transactions()
        return self._epoch

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        self._producer()  # fences older producers of the pipeline, aborts their open transaction
        if not unfinished:
            return SinkRecovery()
        # the real adapter's decision
        return SinkRecovery(committed=frozenset(committed_by_kafka(unfinished, dict(self.cluster.group_offsets))))

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        out: list[Record] = plan.output
        self.writes.append(batch)
        epoch = self._producer()
        self.cluster.begin(epoch)
        self._in_txn = True
        self.proc.step("kafka.begin")
        rows = 0
        for rec in out:
            self.proc.step("kafka.produce")
            self.cluster.produce(epoch, rec)
            rows += 1
        self.proc.step("kafka.flushed")
        return WriteResult([], rows)

    def commit(self, batch: BatchRecord) -> None:
        positions = {r.key: r.until_offset for r in batch.ranges if r.size > 0}
        if not positions and not self._in_txn:
            return  # nothing consumed, nothing produced
        epoch = self._producer()
        if not self._in_txn:
            self.cluster.begin(epoch)
            self._in_txn = True
        self.proc.step("kafka.commit")
        self.cluster.commit(epoch, positions)
        self._in_txn = False
        self.proc.step("kafka.committed")

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        if self.proc.dead:  # SIGKILL: no cleanup runs (see FakeXaSink.discard)
            return
        if self._in_txn and self._epoch is not None:
            self._in_txn = False
            try:
                self.cluster.abort(self._epoch)
            except ProducerFencedError:
                pass  # fenced: the newer producer aborted it already


# --------------------------------------------------------------------------- one pipeline


SINK_KINDS = ("xa", "upsert", "kafka")


class World:
    """One pipeline over one fake topic, one store and one sink server; :meth:`attempt` runs one task attempt
    (its own process, engine and sink adapter over the shared store, topic and server)."""

    def __init__(self, kind: str = "xa", *, partitions: int = 2, topic: str = "t", pipeline_id: str = "p",
                 keys_per_partition: int | None = None, fenced_upsert: bool = False) -> None:
        self.kind, self.topic, self.pipeline_id = kind, topic, pipeline_id
        self.store = FakeStore()
        self.source = FakeSource({topic: partitions})
        self.server: Any = (UpsertTable(keys_per_partition) if kind == "upsert" else
                            {"xa": XaServer, "kafka": KafkaCluster}[kind]())
        self.fenced_upsert = fenced_upsert
        self.check_error: Exception | None = None

    def sink(self, proc: Process) -> Any:
        if self.kind == "upsert":
            return FakeUpsertSink(self.server, proc, self.check_error, self.store if self.fenced_upsert else None)
        return {"xa": FakeXaSink, "kafka": FakeKafkaSink}[self.kind](self.server, proc, self.check_error)

    def produce(self, partition: int, count: int = 1, **kwargs: Any) -> list[Record]:
        return self.source.produce(self.topic, partition, count, **kwargs)

    def attempt(self, run_id: str, proc: Process | None = None, **options: Any) -> BatchSummary:
        """One task attempt of ``run_id`` (``options``: the other ``RunRequest`` fields)."""
        proc = Process() if proc is None else proc
        proc.engine = FakeEngine(self.source, proc)
        proc.sink = self.sink(proc)
        request = RunRequest(self.pipeline_id, run_id, [self.topic], **options)
        RUNNING.append(proc)
        try:
            return run_batch(request, _Stepped(self.store, proc, "store", STORE_WRITES),
                             _Stepped(self.source, proc, "source"), proc.engine, proc.sink)
        finally:
            RUNNING.pop()

    # ------------------------------------------------------------------ the effect

    def visible(self) -> Counter[RecordId]:
        """How many times each record's effect is visible in the sink's output."""
        if self.kind == "xa":
            return Counter(self.server.applied)
        if self.kind == "kafka":
            return Counter(rec.id for rec in self.server.output)
        rows = self.server.rows
        return Counter(rec.id for rec in self.source.records() if rows.get(self.server.key_of(rec)) == rec.value)

    def exactly_once_problems(self, records: Iterable[Record] | None = None) -> list[str]:
        """What differs from "every record's effect visible exactly once" (default: every produced record)."""
        records = self.source.records() if records is None else list(records)
        problems = []
        if self.kind == "upsert":
            expected = self.server.expected(records)
            if self.server.rows != expected:
                wrong = sorted(k for k in expected.keys() | self.server.rows.keys()
                               if self.server.rows.get(k) != expected.get(k))
                problems.append(f"table differs from the expected one at keys {wrong}")
        else:
            visible, expected = self.visible(), Counter(rec.id for rec in records)
            if visible != expected:
                problems.append(f"applied != once: missing {sorted(expected - visible)}, "
                                f"extra {sorted(visible - expected)}")
        if self.kind == "xa" and self.server.prepared:
            problems.append(f"prepared branches left: {sorted(self.server.prepared)}")
        if self.kind == "kafka" and self.server.open is not None:
            problems.append("a Kafka transaction is left open")
        return problems
