"""The data of one micro-batch as the commit protocol (:mod:`airflow_eo.core.protocol`) and its roles pass it.

The batch log's row (:class:`BatchRecord`), what a transform and a sink may know of a batch (:class:`BatchContext`),
a run's request (:class:`RunRequest`) and an attempt's summary (:class:`BatchSummary`), the dead letters and their
chunks, and the write plan the engine hands a sink (:class:`WritePlan`) with what the write reports
(:class:`WriteResult`). The plan is made of two roles, the partition writer a sink runs and the engine's runner of
it (:class:`PartitionWriter`, :class:`PartitionRunner`): they are defined here, beside the plan, so that this module
needs nothing of the protocol's (the protocol, the recovery decisions and the adapters import it; it imports none
of them). No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Protocol

from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.headers import Headers, encode_headers
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange

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
    summary: BatchSummary | None = None
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
    #: the offset store's :meth:`~airflow_eo.core.protocol.OffsetStore.store_identity` ("": not known)
    store_identity: str = ""


@dataclass(frozen=True)
class DeadLetter:
    """A record that failed to parse, kept with where it came from (``on_bad_record='dead_letter'``)."""

    topic: str
    kafka_partition: int
    kafka_offset: int
    record_key: bytes | None
    raw_value: bytes | None
    error: str
    #: the record's Kafka headers, in order (:mod:`airflow_eo.core.headers`)
    headers: Headers = ()


#: A chunk of dead letters streamed through the driver ends at whichever comes first: the records, or the bytes of
#: their keys, values, headers and errors (a few huge bad records must not make one chunk of many gigabytes).
DEAD_LETTER_CHUNK_RECORDS = 10_000
DEAD_LETTER_CHUNK_BYTES = 32 * 1024 * 1024


def dead_letter_chunks(records: Iterable[DeadLetter], pipeline_id: str, batch_id: int,
                       max_records: int = DEAD_LETTER_CHUNK_RECORDS,
                       max_bytes: int = DEAD_LETTER_CHUNK_BYTES) -> Iterator[list[dict[str, Any]]]:
    """Dead letters as rows of :data:`DEAD_LETTER_FIELDS`, in chunks bounded by count and by bytes (a chunk holds at
    least one record, however big): what the driver holds at a time when it writes them."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for r in records:
        headers = encode_headers(r.headers)
        chunk.append({"pipeline_id": pipeline_id, "topic": r.topic, "kafka_partition": r.kafka_partition,
                      "kafka_offset": r.kafka_offset, "batch_id": batch_id, "record_key": r.record_key,
                      "raw_value": r.raw_value, "error": r.error, "kafka_headers": headers})
        size += len(r.record_key or b"") + len(r.raw_value or b"") + len(r.error) + len(headers)
        if len(chunk) >= max_records or size >= max_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


#: The columns of the dead-letter batches a :class:`DeadLetterRoute`'s writer gets (Arrow record batches), in this
#: order: the :class:`DeadLetter` fields with the pipeline and batch they belong to; ``kafka_headers`` is the
#: headers' text (:func:`~airflow_eo.core.headers.encode_headers`).
DEAD_LETTER_FIELDS = ("pipeline_id", "topic", "kafka_partition", "kafka_offset", "batch_id", "record_key",
                      "raw_value", "error", "kafka_headers")


def dead_letter_partition(partition: int) -> int:
    """The partition number (in its xid) of the dead-letter writer of Spark partition ``partition``: its own branch
    or transaction, never the same as the partition's good rows' (``partition``) nor the driver's (-1)."""
    return -2 - partition


@dataclass(frozen=True)
class DeadLetterRoute:
    """Where a one-pass batch's bad records go from the task that finds them (``on_bad_record='dead_letter'``).

    ``writer`` is the sink's partition writer of its dead-letter table (its own XA branch or fenced transaction per
    task, keyed by pipeline, topic, partition and offset: replay-safe); it gets :data:`DEAD_LETTER_FIELDS` batches,
    with partition number :func:`dead_letter_partition` of the task's. The table exists before any task starts.
    """

    writer: PartitionWriter
    pipeline_id: str
    batch_id: int


@dataclass(frozen=True)
class TaskDedup:
    """``dedup_key`` marked by the write tasks of a one-pass batch
    (:func:`~airflow_eo.core.dedup.marks_in_write_tasks`): each task looks its records' ids up with ``lookup`` (the
    sink's ``seen_id_lookup``), writes the events and drops the copies, and writes the ids it saw first with
    ``writer`` (the sink's seen-id writer, partition number :func:`~airflow_eo.core.dedup.seen_id_partition` of the
    task's: its own branch / fenced transaction, committed with the batch's)."""

    writer: PartitionWriter
    lookup: Callable[[Iterable[bytes]], Mapping[bytes, Any]]
    retention: timedelta
    pipeline_id: str
    batch_id: int
    #: the batch's wall clock (epoch ms): no record's time is later (:func:`~airflow_eo.core.dedup.sighting_ms`)
    now_ms: int | None = None


@dataclass(frozen=True)
class TaskPositions:
    """A change stream's positions recorded by the write tasks of a one-pass batch (``changes=``,
    :mod:`airflow_eo.core.changes`): each task writes its changes, then their positions with ``writer`` (the sink's
    change-position writer, partition number :func:`~airflow_eo.core.changes.position_partition` of the task's: its
    own branch / fenced transaction after its output's, committed with the batch's). No job of its own reads the
    written changes again for them."""

    writer: PartitionWriter
    pipeline_id: str
    batch_id: int


@dataclass
class WriteResult:
    """What a sink's write reports: the prepared transactions (xids) to commit, and the rows written.

    When the plan's partition writers counted the batch's records (:attr:`WritePlan.counts_bad_records`), ``counted``
    holds ``(records, bad records)``; None when nothing was counted with the write.
    """

    xids: list[str] = field(default_factory=list)
    rows: int = 0
    counted: tuple[int, int] | None = None
    dead_lettered: bool = False
    #: the copies the write tasks dropped (:class:`TaskDedup`), and the Kafka timestamp (epoch ms) of the batch's
    #: oldest good record, which bounds the purge of old ids
    duplicates: int = 0
    oldest_ms: int | None = None


@dataclass(frozen=True)
class WritePlan:
    """What the engine hands a sink's :meth:`~airflow_eo.core.protocol.Sink.write` for one execution of a batch (made
    per execution).

    A sink writes :attr:`output` by driving it itself (driver-side sinks iterate it) or by handing a partition writer
    to :meth:`run_partitions`, which writes the output (or a projection of it to ``columns``) where the data is. The
    plan says how that run goes; the sink cannot lose it by writing a derived DataFrame, because the runner derives
    what the writers get from the plan:

    - ``counts_bad_records``: the batch is one pass: the partition writers get every parsed record, write the good
      ones and count the bad ones (``WriteResult.counted``); the engine then fails the batch (under
      ``on_bad_record="fail"``) or dead-letters them before the commit point.
    - ``vote``: the writers hold their whole partition without making any of it visible and write only if every
      writer task reported no bad record (the barrier vote: a sink whose writes are visible at once, see
      :meth:`~airflow_eo.core.protocol.Sink.can_hold_writes`).
    - ``dead_letters``: with ``counts_bad_records``, the task that finds a bad record also writes it, with this
      route's writer (the sink's :meth:`~airflow_eo.core.protocol.ExecutorDeadLetters.dead_letter_writer`), in the
      same Spark job: the driver never holds them.
    - ``dedup``: with ``counts_bad_records``, the writers also drop the copies of events already seen and write the
      ids they see first (:class:`TaskDedup`).
    - ``positions``: with ``counts_bad_records``, the writers also record the positions of the changes they wrote
      (:class:`TaskPositions`).
    - ``observation``: a batch with a transform, one pass: the job that writes the output also counts the parsed
      records before the transform (the engine's observed metrics), reported as ``WriteResult.counted``.
    """

    output: Any  # the rows to write (the engine's DataFrame): the batch's good records, transformed
    runner: PartitionRunner
    counts_bad_records: bool = False
    vote: bool = False
    #: the runner's own: every parsed record with its error column, when the writers count bad records
    unfiltered: Any = None
    dead_letters: DeadLetterRoute | None = None
    #: the runner's own: what counts the parsed records while the output is written (a transform's one pass)
    observation: Any = None
    dedup: TaskDedup | None = None
    positions: TaskPositions | None = None

    def __post_init__(self) -> None:
        if self.vote and not self.counts_bad_records:
            raise ValueError("a write plan votes on the bad records its writers count: vote needs counts_bad_records")
        if self.dead_letters is not None and (self.vote or not self.counts_bad_records):
            raise ValueError("the partition writers dead-letter the bad records they count, without a vote")
        if self.dedup is not None and not self.counts_bad_records:
            raise ValueError("the partition writers mark the copies among every record they get: dedup needs "
                             "counts_bad_records")
        if self.positions is not None and not self.counts_bad_records:
            raise ValueError("the partition writers record the positions of the good records they get: positions "
                             "needs counts_bad_records")
        if self.observation is not None and self.counts_bad_records:
            raise ValueError("a write plan counts its records either in its partition writers or by observing them")

    def run_partitions(self, writer: PartitionWriter, columns: Sequence[str] | None = None) -> WriteResult:
        """Run ``writer`` on every partition of the output, or of its projection to ``columns`` (output columns)."""
        return self.runner.run_partitions(self, writer, columns)

    def to_driver(self, columns: Sequence[str]) -> AbstractContextManager[DriverStream]:
        """The output's ``columns`` streamed to the driver, computed once (:meth:`PartitionRunner.to_driver`)."""
        return self.runner.to_driver(self, columns)


@dataclass
class ExecutionResult:
    records_in: int = 0
    rows_out: int = 0
    dead_letters: int = 0
    #: records dropped as copies of an event already seen (``dedup_key``); they count in ``records_in``
    duplicates: int = 0
    xids: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Owner:
    """The task that declares a pipeline, its DAG id and task id kept apart: Airflow ids may hold dots, so DAG
    ``a`` task ``b.c`` and DAG ``a.b`` task ``c`` are two owners although both read ``a.b.c``."""

    dag_id: str
    task_id: str

    def __str__(self) -> str:
        return f"{self.dag_id}.{self.task_id}"


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
    owner: Owner | None = None  # the task that declares the pipeline; a second owner is refused
    sink: SinkRecord | None = None  # what the store records of the sink at the take (for ``airflow eo``)


class BatchStart(Enum):
    """How an attempt came to hold the batch it executes."""

    PLANNED = "planned"  # planned by this attempt
    RESUMED = "resumed"  # left unfinished by an earlier attempt, resumed with its recorded ranges
    REPLAY = "replay"  # interval mode: committed before, its recorded ranges run again


@dataclass(frozen=True)
class BatchSummary:
    """What one attempt did: the task's XCom value and the batch row's ``summary``."""

    pipeline_id: str
    batch_id: int
    run_id: str
    epoch: int
    ranges: tuple[OffsetRange, ...]
    skipped: tuple[OffsetRange, ...] = ()
    records_in: int = 0
    rows_out: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    resumed: bool = False
    replayed: bool = False
    already_committed: bool = False  # a cleared run that had committed: nothing was done
    rolled_forward: bool = False  # the sink had committed it; a later attempt recorded it in the store
    interval: Interval | None = None
    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def mode(self) -> Mode:
        return Mode.CONTINUOUS if self.interval is None else Mode.INTERVAL

    @classmethod
    def of(cls, batch: BatchRecord, run_id: str, epoch: int, result: ExecutionResult | None = None,
           **flags: Any) -> BatchSummary:
        result = result or ExecutionResult()
        return cls(batch.pipeline_id, batch.batch_id, run_id, epoch, tuple(batch.ranges), tuple(batch.skipped),
                   result.records_in, result.rows_out, result.dead_letters, result.duplicates, interval=batch.interval,
                   seconds=dict(result.seconds), **flags)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (XCom, the batch row, Asset event extras)."""
        return {
            "pipeline_id": self.pipeline_id,
            "batch_id": self.batch_id,
            "run_id": self.run_id,
            "epoch": self.epoch,
            "ranges": [_range_dict(r) for r in self.ranges],
            "skipped": [_range_dict(r) for r in self.skipped],
            "records_in": self.records_in,
            "rows_out": self.rows_out,
            "dead_letters": self.dead_letters,
            "duplicates": self.duplicates,
            "resumed": self.resumed,
            "replayed": self.replayed,
            "already_committed": self.already_committed,
            "rolled_forward": self.rolled_forward,
            "mode": self.mode.value,
            "interval": None if self.interval is None else {"start": self.interval.start.isoformat(),
                                                            "end": self.interval.end.isoformat()},
            "seconds": dict(self.seconds),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchSummary:
        interval = data.get("interval")
        return cls(
            pipeline_id=data["pipeline_id"], batch_id=int(data["batch_id"]), run_id=data["run_id"],
            epoch=int(data["epoch"]),
            ranges=tuple(OffsetRange(**r) for r in data.get("ranges") or ()),
            skipped=tuple(OffsetRange(**r) for r in data.get("skipped") or ()),
            records_in=int(data.get("records_in") or 0), rows_out=int(data.get("rows_out") or 0),
            dead_letters=int(data.get("dead_letters") or 0), duplicates=int(data.get("duplicates") or 0),
            resumed=bool(data.get("resumed")),
            replayed=bool(data.get("replayed")), already_committed=bool(data.get("already_committed")),
            rolled_forward=bool(data.get("rolled_forward")),
            interval=None if not interval else Interval(datetime.fromisoformat(interval["start"]),
                                                        datetime.fromisoformat(interval["end"])),
            seconds=dict(data.get("seconds") or {}),
        )


# --------------------------------------------------------------------------- the write plan's roles


class PartitionWriter(Protocol):
    """Writes one partition of a batch's output where the data is (a Spark task); must be picklable."""

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Rows with the same key go to the same partition (XA branches never wait on each other)."""

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        """Write the partition's Arrow record batches; return (xid of its prepared branch or None, rows).

        ``agreed`` (only for a sink whose ``can_hold_writes`` said yes): take in the whole partition without making
        any of it visible, then call it once; make the write visible only if it returns True, else nothing of it
        and return ``(None, 0)``. The write may go on uncommitted while the vote runs
        (:func:`~airflow_eo.core.vote.write_while_voting`: Spark's barrier answers no sooner than about a second).
        """


@dataclass
class DriverStream:
    """A plan's output as a driver-side sink reads it (:meth:`PartitionRunner.to_driver`)."""

    #: the output's rows as Arrow record batches of the asked columns, in partition order; the driver holds two
    #: partitions of them at most (the one read and the next), whatever the batch's size
    batches: Iterator[Any]
    #: ``(records, bad records)`` of the batch, counted by the job that computed the output; None when it could not
    #: be counted there (the engine then counts in a pass of its own)
    counted: tuple[int, int] | None


class PartitionRunner(Protocol):
    """The engine's service to sinks: run a writer on every partition, or bring the output to the driver."""

    def run_partitions(self, plan: WritePlan, writer: PartitionWriter, columns: Sequence[str] | None = None
                       ) -> WriteResult:
        """Run ``writer`` on every partition of ``plan.output`` (projected to ``columns``), as the plan says: counting
        the bad records and holding the vote when it asks so."""

    def to_driver(self, plan: WritePlan, columns: Sequence[str]) -> AbstractContextManager[DriverStream]:
        """While inside, ``plan.output`` projected to ``columns`` streams to the driver: one Spark job computes it
        (reading, parsing and transforming the batch once, counting its records on the way) and keeps it where it
        was computed; the driver then reads it partition by partition. Released on exit."""


def _range_dict(r: OffsetRange) -> dict[str, Any]:
    return {"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset,
            "until_offset": r.until_offset}
