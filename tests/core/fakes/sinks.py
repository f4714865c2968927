"""The three sinks, each over a shared server whose state outlives the attempts: XA, upsert and Kafka."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.batch import BatchContext, BatchRecord, DeadLetter, WritePlan, WriteResult
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.recovery import BranchAction, SinkRecovery, committed_by_kafka, decide_branch
from airflow_eo.core.xid import Xid, pipeline_key
from tests.core.fakes.processes import Process
from tests.core.fakes.source import Record, RecordId
from tests.core.fakes.store import FakeStore


class ProducerFencedError(Exception):
    """Kafka: a newer producer of the same ``transactional.id`` called ``init_transactions``."""


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

    def close(self) -> None:
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
