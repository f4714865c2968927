"""Operating pipelines: the read models and repair actions over the offset store, Kafka and the sinks.

The one place for operations: ``airflow eo`` (``airflow_eo/cli``) is a thin layer over
:class:`PipelineOperations`, and a UI would be another. Every decision comes from the core
(``airflow_eo/core/recovery.py``: what happens to an in-doubt branch, lag, what a rewind moves and
when it is refused), and :meth:`PipelineOperations.recover` runs the very step 2 of a task attempt
(:func:`airflow_eo.core.protocol.recover_pipeline`). This module does the I/O through the adapters and
imports nothing of Airflow: where the connections come from is :class:`Connections`' business
(``airflow_eo/hooks/operations.py`` reads Airflow connections).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Protocol

from airflow_eo.core.abilities import ConsumerGroupSink, DeadLetterTable, InDoubtSink, TableCommitSink, role
from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import ConfigurationError, OperationError
from airflow_eo.core.headers import decode_headers
from airflow_eo.core.orphans import (
    InDoubtServer,
    OpenTransaction,
    OpenTransactionServer,
    Orphan,
    OrphanAction,
    ScannedBranch,
    branch_age,
    decide_open_transaction,
    decide_orphan,
    oldest_age_by_database,
    overdue,
    owner_of,
    pipeline_keys,
    seen_in_both,
)
from airflow_eo.core.planning import PartitionOffsets
from airflow_eo.core.protocol import Sink, recover_pipeline
from airflow_eo.core.ranges import OffsetRange, TopicPartition
from airflow_eo.core.recovery import BatchAction, BranchAction, BranchDecision, decide_branch, decide_unfinished
from airflow_eo.core.rewind import DOUBLE_COUNT_FLAG, RewindKind, RewindPlan, RewindTarget, check_rewind, plan_rewind
from airflow_eo.core.sinks import capabilities_of
from airflow_eo.core.states import UNFINISHED, BatchState
from airflow_eo.core.status import AuditEntry, BatchInfo, PartitionStatus, PipelineInfo, partition_status
from airflow_eo.core.stores import PipelineLedger
from airflow_eo.core.verify import (
    Finding,
    TaskRun,
    audited_batches,
    audited_moves,
    check_branches,
    check_interval_tiling,
    check_mirror,
    check_open_transactions,
    check_runs,
    check_sink_commits,
    check_tiling,
    runs_in_question,
)
from airflow_eo.kafka.offsets import KafkaOffsetSource, group_id

log = logging.getLogger(__name__)

#: How many of the newest batch rows a recovery report reads for the batches it names.
RECENT_BATCHES = 500
#: "Every row" for the reads of ``verify``, which checks a pipeline's whole history.
ALL_ROWS = 2**62
#: The audit action of ``recover --orphans``.
ORPHANS_ACTION = "recover orphans"


class Connections(Protocol):
    """Where the offset store, the source cluster and a pipeline's sink are (Airflow connections, for the CLI)."""

    def store(self) -> PipelineLedger: ...
    def offset_source(self) -> KafkaOffsetSource: ...
    def sink(self, pipeline_id: str, record: SinkRecord) -> Sink:
        """The adapter of the recorded sink (its recovery is the one a task attempt runs), built by its kind."""


class TaskRuns(Protocol):
    """Where a pipeline's task ran (Airflow's metadata database, for ``verify``)."""

    def task_runs(self, dag_id: str, task_id: str) -> list[TaskRun]:
        """Every run of the task, with the task instance's state and the run's data interval."""


# --------------------------------------------------------------------------- read models


@dataclass(frozen=True)
class InDoubtBranch:
    """A prepared branch of the pipeline (an XA branch, a PostgreSQL prepared transaction), and what recovery does
    with it."""

    decision: BranchDecision
    age_seconds: float | None  # since its batch row was last written by the attempt that prepared it

    def to_dict(self) -> dict[str, Any]:
        d = self.decision
        return {"xid": d.xid, "batch_id": d.batch_id, "epoch": d.epoch, "partition": d.partition,
                "age_seconds": None if self.age_seconds is None else round(self.age_seconds, 1),
                "action": d.action.value, "reason": d.reason}


@dataclass(frozen=True)
class UnfinishedBatch:
    """A batch that did not reach its end (a running attempt, or one that died), and what recovery does."""

    record: BatchRecord
    updated_at: datetime | None
    action: BatchAction
    reason: str

    def to_dict(self) -> dict[str, Any]:
        b = self.record
        return {"batch_id": b.batch_id, "run_id": b.run_id, "state": b.state.value, "epoch": b.epoch,
                "ranges": [_range(r) for r in b.ranges], "updated_at": _iso(self.updated_at),
                "recover": self.action.value, "reason": self.reason}


@dataclass(frozen=True)
class PipelineOverview:
    """One line of ``airflow eo pipelines``."""

    info: PipelineInfo
    last_batch: BatchInfo | None
    lag: int | None  # total over the partitions; None when unknown

    def to_dict(self) -> dict[str, Any]:
        last = self.last_batch
        return {"pipeline_id": self.info.pipeline_id, "owner": self.info.owner,
                "mode": self.info.mode.value if self.info.mode else None, "epoch": self.info.epoch,
                "sink": self.info.sink.kind if self.info.sink else None,
                "last_batch_id": last.record.batch_id if last else None,
                "last_state": last.record.state.value if last else None,
                "last_at": _iso(last.last_change) if last else None, "lag": self.lag}


@dataclass(frozen=True)
class PipelineStatus:
    """``airflow eo status``: partitions, the unfinished batch, in-doubt branches."""

    info: PipelineInfo
    partitions: list[PartitionStatus]
    unfinished: list[UnfinishedBatch]
    in_doubt: list[InDoubtBranch]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**_pipeline(self.info), "partitions": [p.to_dict() for p in self.partitions],
                "lag": _total(self.partitions), "unfinished": [u.to_dict() for u in self.unfinished],
                "in_doubt": [b.to_dict() for b in self.in_doubt], "notes": list(self.notes)}


@dataclass(frozen=True)
class History:
    """``airflow eo history``: batches and what people did, newest first."""

    info: PipelineInfo
    batches: list[BatchInfo]
    audit: list[AuditEntry]

    def to_dict(self) -> dict[str, Any]:
        return {**_pipeline(self.info), "batches": [batch_dict(b) for b in self.batches],
                "audit": [audit_dict(a) for a in self.audit]}


@dataclass(frozen=True)
class RecoverReport:
    """``airflow eo recover``: what recovery did (or, in a dry run, would do)."""

    pipeline_id: str
    dry_run: bool
    epoch: int | None  # the epoch taken; None in a dry run
    branches: list[InDoubtBranch]
    batches: list[UnfinishedBatch]
    left: list[str] = field(default_factory=list)  # branches still in doubt afterwards (xids)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "dry_run": self.dry_run, "epoch": self.epoch,
                "branches": [b.to_dict() for b in self.branches], "batches": [b.to_dict() for b in self.batches],
                "left_in_doubt": list(self.left)}


@dataclass(frozen=True)
class RewindReport:
    """``airflow eo rewind``: the plan, whether it is refused, whether it was applied."""

    plan: RewindPlan
    applied: bool
    refusal: str | None = None
    epoch: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "applied": self.applied, "refused": self.refusal, "epoch": self.epoch,
                "notes": list(self.notes)}


@dataclass(frozen=True)
class VerifyReport:
    """``airflow eo verify``: every disagreement between the store, the group, the sink and Airflow (``findings``),
    and what could not be checked, and why (``unchecked``)."""

    pipeline_id: str
    checked: list[str]
    findings: list[Finding]
    unchecked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "checked": list(self.checked),
                "findings": [f.to_dict() for f in self.findings], "unchecked": list(self.unchecked)}


@dataclass(frozen=True)
class InDoubtReport:
    """``airflow eo verify --all``: every in-doubt branch of ours on every database the store's pipelines recorded
    as their sink's, attributed and decided (``orphans``); the databases scanned, and those that could not be."""

    orphans: list[Orphan]
    databases: list[str]
    unchecked: list[str] = field(default_factory=list)
    transactions: list[OpenTransaction] = field(default_factory=list)  # Kafka-sink pipelines' open transactions

    def oldest_age_seconds(self) -> dict[str, float]:
        """The gauge ``airflow_eo.in_doubt.oldest_age_seconds``, per database (and Kafka cluster) scanned."""
        return oldest_age_by_database([*self.orphans, *self.transactions], self.databases)

    def to_dict(self, older_than_s: float) -> dict[str, Any]:
        return {"older_than_seconds": older_than_s, "databases": list(self.databases),
                "in_doubt": [o.to_dict() for o in self.orphans] + [t.to_dict() for t in self.transactions],
                "overdue": [o.xid.encode() for o in overdue(self.orphans, older_than_s)]
                + [t.key for t in overdue(self.transactions, older_than_s)],
                "oldest_age_seconds": self.oldest_age_seconds(), "unchecked": list(self.unchecked)}


@dataclass(frozen=True)
class OrphanOutcome:
    """What ``recover --orphans`` did (or would do) with one branch."""

    orphan: Orphan | OpenTransaction
    outcome: str  # committed, rolled back, already ended, left, would commit, skipped: <why>
    epoch: int | None = None  # the pipeline's epoch taken to act on it

    def to_dict(self) -> dict[str, Any]:
        return {**self.orphan.to_dict(), "outcome": self.outcome, "taken_epoch": self.epoch}


@dataclass(frozen=True)
class OrphansReport:
    """``airflow eo recover --orphans``."""

    dry_run: bool
    outcomes: list[OrphanOutcome]
    databases: list[str]
    unchecked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "databases": list(self.databases),
                "branches": [o.to_dict() for o in self.outcomes], "unchecked": list(self.unchecked)}


@dataclass(frozen=True)
class _Verified:
    """One check of ``verify``: its findings and what it checked, or why it could not."""

    findings: list[Finding] = field(default_factory=list)
    checked: str | None = None
    unchecked: str | None = None


@dataclass(frozen=True)
class PipelinePage:
    """Everything the UI tab shows of one pipeline: its status, recent batches and audit, dead letters."""

    status: PipelineStatus
    history: History
    dead_letters: list[dict[str, Any]] | None  # None: the sink keeps none (its bad records fail the batch)
    task_id: str | None = None  # the DAG's task that runs it
    verify: VerifyReport | None = None  # None: not asked

    def to_dict(self) -> dict[str, Any]:
        return {**self.status.to_dict(), "task_id": self.task_id,
                "verify": None if self.verify is None else self.verify.to_dict(),
                "batches": [batch_dict(b) for b in self.history.batches],
                "audit": [audit_dict(a) for a in self.history.audit], "dead_letters": self.dead_letters}


# --------------------------------------------------------------------------- operations


class PipelineOperations:
    """Read models and repair actions of the pipelines in one offset store.

    :param connections: the store, the source cluster and the sinks.
    :param actor: who runs the operations (recorded in ``eo_audit``): an OS user, an Airflow user.
    :param runs: where the pipelines' tasks ran (Airflow's metadata database); None: ``verify`` does not compare
        the batches with the runs.
    :param error_details: whether a note about a dependency that could not be read (a sink database, Kafka)
        quotes the error's text (the CLI: its user holds the connections) or gives only its kind and a reference
        to the full text in this process's log (the UI tab: every reader of the DAG sees the notes, and an error's
        text names hosts and users).
    """

    def __init__(self, connections: Connections, actor: str, error_details: bool = True,
                 runs: TaskRuns | None = None) -> None:
        self.connections = connections
        self.runs = runs
        self.actor = actor
        self.error_details = error_details
        self.store = connections.store()
        self._source: KafkaOffsetSource | None = None

    def source(self) -> KafkaOffsetSource:
        """The source cluster's offsets (connected on first use: not every command needs Kafka)."""
        if self._source is None:
            self._source = self.connections.offset_source()
        return self._source

    # ------------------------------------------------------------------ reads

    def pipelines(self) -> list[PipelineOverview]:
        """Every pipeline in the store, with its newest batch and its total lag."""
        infos = self.store.pipelines()
        committed = self.store.all_committed_offsets()
        latest = self.store.latest_batches()
        topics = {p.pipeline_id: _topics(committed.get(p.pipeline_id, {}), latest.get(p.pipeline_id))
                  for p in infos if p.mode is not Mode.INTERVAL}
        broker, _ = self._broker_offsets(sorted({t for ts in topics.values() for t in ts}))
        overview = []
        for info in infos:
            lag = None
            if info.pipeline_id in topics and broker is not None:
                parts = [p for p in broker.values() if p.topic in topics[info.pipeline_id]]
                lag = _total(partition_status(parts, committed.get(info.pipeline_id, {})))
            overview.append(PipelineOverview(info, latest.get(info.pipeline_id), lag))
        return overview

    def status(self, pipeline_id: str) -> PipelineStatus:
        """Partitions (committed, last stable and log-start offsets, lag), unfinished batches and in-doubt branches.

        :param pipeline_id: the pipeline.
        """
        info = self.store.pipeline(pipeline_id)
        notes: list[str] = []
        committed = self.store.committed_offsets(pipeline_id)
        partitions: list[PartitionStatus] = []
        if info.mode is Mode.INTERVAL:
            notes.append("interval mode: each batch is a data interval, there is no committed position (see history)")
        else:
            latest = self.store.batch_history(pipeline_id, 1)
            topics = _topics(committed, latest[0] if latest else None)
            if not topics:
                notes.append("no batch planned yet: the store does not know the pipeline's topics")
            broker, note = self._broker_offsets(topics)
            notes.extend([note] if note else [])
            partitions = partition_status(None if broker is None else list(broker.values()), committed)
            lost = [p for p in partitions if p.lost]
            if lost:
                notes.append("records were deleted by retention before the pipeline read them: "
                             + ", ".join(f"{p.topic}[{p.partition}] {p.lost} offsets" for p in lost)
                             + "; the next batch fails unless skip_lost_records=True")
        unfinished = self._unfinished(info, notes)
        in_doubt = self._in_doubt(info, notes)
        table = self._table(info)
        if table is not None:
            try:
                notes.append(table.table_state(info.pipeline_id))
            except Exception as exc:
                notes.append(f"the sink's table is unknown ({self._said(exc, 'table')})")
        if info.sink is None:
            notes.append("the store does not know this pipeline's sink yet (its last run predates sink recording)")
        return PipelineStatus(info, partitions, unfinished, in_doubt, notes)

    def history(self, pipeline_id: str, limit: int = 20) -> History:
        """The newest batches and audit entries.

        :param pipeline_id: the pipeline.
        :param limit: at most this many of each.
        """
        info = self.store.pipeline(pipeline_id)
        return History(info, self.store.batch_history(pipeline_id, limit), self.store.audit_log(pipeline_id, limit))

    def dead_letters(self, pipeline_id: str, batch_id: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The pipeline's dead letters, from the table its sink declares (``eo_dead_letter`` by default).

        :param pipeline_id: the pipeline.
        :param batch_id: only this batch's.
        :param limit: at most this many.
        """
        info = self.store.pipeline(pipeline_id)
        if info.sink is None:
            raise OperationError(f"the offset store does not know pipeline {pipeline_id!r}'s sink yet (its last run "
                                 "predates sink recording): run it once, then its dead letters can be found")
        capabilities = capabilities_of(info.sink)
        if capabilities is None or not capabilities.dead_letters:
            raise OperationError(f"pipeline {pipeline_id!r} writes through {info.sink.kind}, which keeps no dead "
                                 "letters (its bad records fail the batch)")
        sink = role(self.connections.sink(pipeline_id, info.sink), DeadLetterTable)
        return [_dead_letter(row) for row in sink.dead_letters(pipeline_id, batch_id, limit) or []]

    def pipelines_of_dag(self, dag_id: str, task_ids: Sequence[str]) -> dict[str, str]:
        """The pipelines the DAG's tasks own (by DAG id and task id; a pipeline last taken before the store kept
        them apart, by its owner's text ``<dag_id>.<task_id>``, which a DAG ``a.b`` task ``c`` shares with DAG ``a``
        task ``b.c``, until its next run records them).

        :param dag_id: the DAG.
        :param task_ids: its tasks (whatever their operator class: subclasses of ours count).
        :return: pipeline id -> task id, in pipeline id order.
        """
        owners = {f"{dag_id}.{task_id}": task_id for task_id in task_ids}
        found = {}
        for p in sorted(self.store.pipelines(), key=lambda p: p.pipeline_id):
            if p.owned_by is not None:
                if p.owned_by.dag_id == dag_id and p.owned_by.task_id in task_ids:
                    found[p.pipeline_id] = p.owned_by.task_id
            elif p.owner in owners:
                found[p.pipeline_id] = owners[p.owner]
        return found

    def page(self, pipeline_id: str, limit: int = 20, task_id: str | None = None,
             verify: bool = False) -> PipelinePage:
        """Status, the newest ``limit`` batches and audit entries, and the newest dead letters of a pipeline.

        :param pipeline_id: the pipeline.
        :param limit: at most this many batches, audit entries and dead letters.
        :param task_id: the task that runs it (shown).
        :param verify: with :meth:`verify`'s report.
        """
        status = self.status(pipeline_id)
        dead_letters = None
        capabilities = capabilities_of(status.info.sink)
        if capabilities is not None and capabilities.dead_letters:
            try:
                dead_letters = self.dead_letters(pipeline_id, limit=limit)
            except Exception as exc:  # a sink database that is down must not hide the store's view
                status.notes.append(f"dead letters unknown: {self._said(exc, 'dead letters of ' + pipeline_id)}")
        return PipelinePage(status, self.history(pipeline_id, limit), dead_letters, task_id,
                            self.verify(pipeline_id) if verify else None)

    def verify(self, pipeline_id: str) -> VerifyReport:
        """Whether the store, the consumer group, the sink's server and Airflow agree (read-only); each check is
        :mod:`airflow_eo.core.verify`'s. A check whose dependency cannot be read is listed in ``unchecked``.

        :param pipeline_id: the pipeline.
        """
        info = self.store.pipeline(pipeline_id)
        batches = [b.record for b in self.store.batch_history(pipeline_id, ALL_ROWS)]
        audit = self.store.audit_log(pipeline_id, ALL_ROWS)
        committed = self.store.committed_offsets(pipeline_id)
        parts = [self._verify_tiling(info, batches, committed, audit), self._verify_mirror(info, batches, committed),
                 self._verify_in_doubt(info, batches), self._verify_runs(info, batches, audit)]
        return VerifyReport(pipeline_id, [p.checked for p in parts if p.checked],
                            [f for p in parts for f in p.findings], [p.unchecked for p in parts if p.unchecked])

    def _verify_tiling(self, info: PipelineInfo, batches: list[BatchRecord], committed: Mapping[TopicPartition, int],
                       audit: list[AuditEntry]) -> _Verified:
        if info.mode is Mode.INTERVAL:
            return _Verified(check_interval_tiling(batches), "tiling: committed intervals never overlap, adjacent "
                                                             "ones meet")
        return _Verified(check_tiling(batches, committed, audited_moves(audit)),
                         f"tiling: {sum(b.state is BatchState.COMMITTED for b in batches)} committed batches")

    def _verify_mirror(self, info: PipelineInfo, batches: list[BatchRecord],
                       committed: Mapping[TopicPartition, int]) -> _Verified:
        if info.mode is Mode.INTERVAL:
            return _Verified(unchecked="mirror: interval-mode pipelines have no consumer group (no committed "
                                       "position)")
        group = group_id(info.pipeline_id)
        capabilities = capabilities_of(info.sink)
        read = {r.key for b in batches if b.state is BatchState.COMMITTED for r in b.ranges if r.size}
        without_records = ({k for k in committed if k not in read}
                           if capabilities is not None and capabilities.consumer_group else set())
        try:
            offsets = self.source().group_offsets(info.pipeline_id, committed)
        except Exception as exc:
            return _Verified(unchecked=f"mirror: the offsets of group {group} could not be read "
                                       f"({self._said(exc, 'group offsets')})")
        return _Verified(check_mirror(group, committed, offsets, without_records),
                         f"mirror: group {group}, {len(committed)} partitions")

    def _verify_in_doubt(self, info: PipelineInfo, batches: list[BatchRecord]) -> _Verified:
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None:
            return _Verified(unchecked="in-doubt: the store does not know the pipeline's sink yet")
        if not capabilities.in_doubt_branches and not capabilities.consumer_group:
            return _Verified(checked=f"in-doubt: {info.sink.kind} leaves nothing in doubt")
        try:
            if capabilities.in_doubt_branches:
                sink = role(self.connections.sink(info.pipeline_id, info.sink), InDoubtSink)
                return _Verified(check_branches(sink.in_doubt(info.pipeline_id), {b.batch_id: b for b in batches}),
                                 f"in-doubt: prepared branches on {info.sink.kind}'s server")
            group = self._kafka_group(info.pipeline_id, info)
            assert group is not None  # a consumer_group kind
            unfinished = [b for b in batches if b.state in UNFINISHED]
            findings = check_sink_commits(unfinished, group.committed_batches(unfinished) if unfinished else ())
            findings += check_open_transactions(group.open_transactions(), unfinished)
            return _Verified(findings, "in-doubt: no Kafka transaction committed a batch the store has not recorded, "
                                       "none is open on the output topic between batches")
        except Exception as exc:
            return _Verified(unchecked=f"in-doubt: the sink could not be read ({self._said(exc, 'in-doubt')})")

    def _verify_runs(self, info: PipelineInfo, batches: list[BatchRecord], audit: list[AuditEntry]) -> _Verified:
        owner = info.owned_by
        if self.runs is None:
            return _Verified(unchecked="runs: Airflow's metadata database is not at hand here")
        if owner is None:
            return _Verified(unchecked="runs: the store does not know the pipeline's DAG and task apart (its next "
                                       "run records them)")
        try:
            runs = self.runs.task_runs(owner.dag_id, owner.task_id)
        except Exception as exc:
            return _Verified(unchecked=f"runs: Airflow's runs could not be read ({self._said(exc, 'Airflow runs')})")
        questioned = runs_in_question(runs, batches, info.pipeline_id)
        elsewhere: dict[str, str] = {}
        if questioned:  # the task's other pipeline ids (edited, templated, renamed): their runs are theirs
            others = [p.pipeline_id for p in self.store.pipelines() if p.pipeline_id != info.pipeline_id
                      and (p.owned_by == owner or (p.owned_by is None and p.owner == info.owner))]
            elsewhere = self.store.runs_recorded(others, questioned)
        return _Verified(check_runs(runs, batches, audited_batches(audit), info.pipeline_id, elsewhere),
                         f"runs: {len(runs)} runs of {owner.dag_id}.{owner.task_id}")

    def in_doubt_everywhere(self, unknown_rollback: bool = False) -> InDoubtReport:
        """Every in-doubt branch carrying our prefix on every database that a pipeline of the store recorded as its
        two-phase sink's (read-only), each attributed to its pipeline (or none) and decided by the store
        (:mod:`airflow_eo.core.orphans`).

        :param unknown_rollback: decide a branch of a pipeline the store never knew as a rollback (else: left).
        """
        servers, unchecked, sink_of = self._in_doubt_servers()
        ids = [p.pipeline_id for p in self.store.pipelines()]
        keys = pipeline_keys(ids)
        scanned: list[tuple[str, str, ScannedBranch]] = []
        databases = []
        for label, (server, _) in sorted(servers.items()):
            try:
                found = server.scan_in_doubt()
            except Exception as exc:
                unchecked.append(f"{label}: could not be scanned ({self._said(exc, 'in-doubt scan of ' + label)})")
                continue
            databases.append(label)
            scanned.extend((label, server.in_doubt_branch_name(), b) for b in found)
        owners = {b.xid: owner_of(b.xid, keys, ids) for _, _, b in scanned}
        rows = self._batch_rows(owners)
        now = datetime.now(timezone.utc)
        orphans = []
        for label, name, b in scanned:
            pipeline = owners[b.xid]
            row = rows.get((pipeline, b.xid.batch_id)) if pipeline is not None else None
            action, reason = decide_orphan(b.xid, pipeline, row.record if row else None, unknown_rollback,
                                           sink_of.get(pipeline) if pipeline is not None else None, label)
            age = branch_age(b.prepared_at, b.xid.epoch, row.record.epoch if row else None,
                             row.created_at if row else None, row.updated_at if row else None, now)
            orphans.append(Orphan(label, name, b.xid, pipeline, age, b.locks, action, reason))
        transactions = self._open_transactions(databases, unchecked, now)
        return InDoubtReport(orphans, databases, unchecked, transactions)

    def _open_transactions(self, databases: list[str], unchecked: list[str],
                           now: datetime) -> list[OpenTransaction]:
        """The open transactions on every Kafka-sink pipeline's output topic, each with the pipeline's unfinished
        batch and what ``recover`` does (:func:`~airflow_eo.core.orphans.decide_open_transaction`)."""
        found: list[OpenTransaction] = []
        for info in self.store.pipelines():
            capabilities = capabilities_of(info.sink)
            if info.sink is None or capabilities is None or not capabilities.consumer_group:
                continue
            try:
                sink = self.connections.sink(info.pipeline_id, info.sink)
                if not isinstance(sink, OpenTransactionServer):
                    continue
                label = sink.in_doubt_server()
                open_ones = sink.open_transactions()
                unfinished = self.store.unfinished_batches(info.pipeline_id) if open_ones else []
                committed = sink.committed_batches(unfinished) if unfinished else set()
            except Exception as exc:
                unchecked.append(f"Kafka sink of {info.pipeline_id}: could not be read "
                                 f"({self._said(exc, 'open transactions of ' + info.pipeline_id)})")
                continue
            if label not in databases:
                databases.append(label)
            if not open_ones:
                continue
            batch_id, action, reason = decide_open_transaction(unfinished, committed)
            row = self.store.batch_history(info.pipeline_id, 1, [batch_id]) if batch_id is not None else []
            age = branch_age(None, row[0].record.epoch, row[0].record.epoch, row[0].created_at, row[0].updated_at,
                             now) if row else None
            found.extend(OpenTransaction(label, info.pipeline_id, sink.transactional_id(), topic, partition, stable,
                                         end, batch_id, age, action, reason)
                         for (topic, partition), (stable, end) in sorted(open_ones.items()))
        return found

    def recover_orphans(self, apply: bool = False, reason: str | None = None, unknown_rollback: bool = False,
                        older_than_s: float = 600.0, scan_interval_s: float = 5.0) -> OrphansReport:
        """Resolve every in-doubt branch of ours left on the store's sink databases (``apply``), or show what that
        would do (the default).

        Two scans ``scan_interval_s`` apart: a branch only one lists, or not older than ``older_than_s``, is
        skipped (in flight: its attempt commits or rolls it back). For each pipeline with branches to act on, its
        epoch is taken with an audit row (fencing any attempt that could still commit the batch), its batch rows are
        read again and decide each branch (:func:`~airflow_eo.core.orphans.decide_orphan`); the audit row then
        records what was done. A branch of a pipeline the store never knew is left unless ``unknown_rollback``
        (then rolled back, with an audit row under its key).
        """
        if apply and not (reason or "").strip():
            raise OperationError("recover --orphans --apply needs --reason TEXT (recorded in the audit log)")
        first = self.in_doubt_everywhere(unknown_rollback)
        time.sleep(scan_interval_s)
        second = self.in_doubt_everywhere(unknown_rollback)
        both = seen_in_both(((o.database, o.xid) for o in first.orphans),
                            ((o.database, o.xid) for o in second.orphans))
        old = {(o.database, o.xid) for o in overdue(second.orphans, older_than_s)}
        outcomes: list[OrphanOutcome] = []
        act: list[Orphan] = []
        for o in second.orphans:
            key = (o.database, o.xid)
            if key not in both:
                outcomes.append(OrphanOutcome(o, f"skipped: listed by one scan of two {scan_interval_s:g}s apart "
                                                 "(in flight)"))
            elif key not in old:
                outcomes.append(OrphanOutcome(o, f"skipped: not older than {older_than_s:g}s"))
            elif o.action is OrphanAction.LEAVE:
                outcomes.append(OrphanOutcome(o, "left"))
            elif not apply:
                outcomes.append(OrphanOutcome(o, f"would {o.action.value}"))
            else:
                act.append(o)
        unchecked = sorted(set(first.unchecked) | set(second.unchecked))
        outcomes.extend(self._end_open_transactions(first, second, apply, reason, older_than_s, scan_interval_s))
        if not act:
            return OrphansReport(not apply, outcomes, second.databases, unchecked)
        assert reason is not None
        servers, _, sink_of = self._in_doubt_servers()
        by_pipeline: dict[str | None, list[Orphan]] = {}
        for o in act:
            by_pipeline.setdefault(o.pipeline_id, []).append(o)
        for pipeline, orphans in sorted(by_pipeline.items(), key=lambda kv: kv[0] or ""):
            if pipeline is None:
                outcomes.extend(self._end_unknown(o, servers, reason.strip()) for o in orphans)
            else:
                outcomes.extend(self._end_fenced(pipeline, orphans, servers, sink_of, reason.strip()))
        return OrphansReport(False, outcomes, second.databases, unchecked)

    def _end_open_transactions(self, first: InDoubtReport, second: InDoubtReport, apply: bool, reason: str | None,
                               older_than_s: float, scan_interval_s: float) -> list[OrphanOutcome]:
        """A Kafka-sink pipeline's open transactions both scans list and older than the threshold: the pipeline's
        ``recover`` (its epoch taken, audited; ``init_transactions`` aborts its producer's open transaction, a
        batch Kafka committed is rolled forward), once per pipeline."""
        both = seen_in_both((t.key for t in first.transactions), (t.key for t in second.transactions))
        old = {t.key for t in overdue(second.transactions, older_than_s)}
        outcomes = []
        recovered: dict[str, int | None] = {}
        for t in second.transactions:
            if t.key not in both:
                outcomes.append(OrphanOutcome(t, f"skipped: listed by one scan of two {scan_interval_s:g}s apart "
                                                 "(in flight)"))
            elif t.key not in old:
                outcomes.append(OrphanOutcome(t, f"skipped: not older than {older_than_s:g}s"))
            elif not apply:
                outcomes.append(OrphanOutcome(t, f"would recover {t.pipeline_id} ({t.action})"))
            else:
                assert reason is not None
                if t.pipeline_id not in recovered:
                    recovered[t.pipeline_id] = self.recover(t.pipeline_id, apply=True, reason=reason.strip()).epoch
                epoch = recovered[t.pipeline_id]
                outcomes.append(OrphanOutcome(t, f"recovered ({t.action})" if epoch is not None else
                                              "left: the pipeline has nothing to recover (Kafka aborts it after "
                                              "transaction.timeout.ms)", epoch))
        return outcomes

    def _end_fenced(self, pipeline_id: str, orphans: list[Orphan], servers: Mapping[str, tuple[InDoubtServer, Any]],
                    sink_of: Mapping[str, str], reason: str) -> list[OrphanOutcome]:
        """Take the pipeline's epoch (audited), decide its branches again by its batch rows as they are now (no
        attempt of an earlier epoch can commit a batch any more), end them, complete the audit row."""
        plan = [{**o.to_dict(), "outcome": f"will {o.action.value}"} for o in orphans]
        epoch = self.store.take_audited(pipeline_id, self.actor, ORPHANS_ACTION, reason,
                                        {"branches": plan, "completed": False})
        log.info("pipeline %s taken with epoch %d to resolve %d in-doubt branches", pipeline_id, epoch, len(orphans))
        ids = sorted({o.xid.batch_id for o in orphans})
        rows = {b.record.batch_id: b.record for b in self.store.batch_history(pipeline_id, len(ids), ids)}
        done = []
        for o in orphans:
            action, why = decide_orphan(o.xid, pipeline_id, rows.get(o.xid.batch_id), sink_database=sink_of.get(
                pipeline_id), found_on=o.database)
            decided = replace(o, action=action, reason=why)
            done.append(OrphanOutcome(decided, self._end(decided, servers), epoch))
        self.store.complete_audit(pipeline_id, epoch, ORPHANS_ACTION,
                                  {"branches": [d.to_dict() for d in done], "completed": True})
        return done

    def _end_unknown(self, orphan: Orphan, servers: Mapping[str, tuple[InDoubtServer, Any]],
                     reason: str) -> OrphanOutcome:
        """Roll back a branch no pipeline of the store owns (asked for), on record under its key."""
        outcome = OrphanOutcome(orphan, self._end(orphan, servers))
        self.store.record_audit(f"eo:{orphan.xid.pipeline_key}", self.actor, ORPHANS_ACTION, reason,
                                {"branches": [outcome.to_dict()], "completed": True})
        return outcome

    def _end(self, orphan: Orphan, servers: Mapping[str, tuple[InDoubtServer, Any]]) -> str:
        if orphan.action is OrphanAction.LEAVE:
            return "left"
        server = servers[orphan.database][0]
        action = BranchAction(orphan.action.value)
        ended = server.end_branch(orphan.xid, action)
        log.warning("in-doubt %s %s of %s on %s: %s (%s)", orphan.branch, orphan.xid.encode(), orphan.pipeline,
                    orphan.database, action.value if ended else "already ended", orphan.reason)
        if not ended:
            return "already ended"
        return "committed" if action is BranchAction.COMMIT else "rolled back"

    def _in_doubt_servers(self) -> tuple[dict[str, tuple[InDoubtServer, set[str]]], list[str], dict[str, str]]:
        """The databases the store's pipelines recorded as their two-phase sinks' (label -> the adapter that reads
        it, the connection ids reaching it), one per server (two connections to one server are one database); the
        sinks whose database could not be reached, and why; and each pipeline's database (pipeline id -> label)."""
        by_server: dict[str, tuple[InDoubtServer, set[str]]] = {}
        unchecked: list[str] = []
        built: dict[tuple[str, str | None], str | None] = {}
        sink_of: dict[str, str] = {}
        for info in self.store.pipelines():
            capabilities = capabilities_of(info.sink)
            if info.sink is None or capabilities is None or not capabilities.in_doubt_branches:
                continue
            where = (info.sink.kind, info.sink.conn_id)
            if where not in built:
                built[where] = None
                try:
                    sink = self.connections.sink(info.pipeline_id, info.sink)
                except Exception as exc:
                    unchecked.append(f"{info.sink.kind} on connection {info.sink.conn_id}: could not be reached "
                                     f"({self._said(exc, 'sink of ' + info.pipeline_id)})")
                    continue
                if not isinstance(sink, InDoubtServer):
                    continue
                built[where] = server = sink.in_doubt_server()
                by_server.setdefault(server, (sink, set()))[1].add(str(info.sink.conn_id))
            # A pipeline whose database could not be read: none of its branches elsewhere is decided (which store's?)
            sink_of[info.pipeline_id] = built[where] or f"connection {info.sink.conn_id} (not reachable)"
        return by_server, unchecked, sink_of

    def _batch_rows(self, owners: Mapping[Any, str | None]) -> dict[tuple[str, int], BatchInfo]:
        """The batch rows the branches name, per (pipeline, batch id)."""
        wanted: dict[str, set[int]] = {}
        for xid, pipeline in owners.items():
            if pipeline is not None:
                wanted.setdefault(pipeline, set()).add(xid.batch_id)
        rows = {}
        for pipeline, ids in wanted.items():
            for b in self.store.batch_history(pipeline, len(ids), sorted(ids)):
                rows[(pipeline, b.record.batch_id)] = b
        return rows

    # ------------------------------------------------------------------ repairs

    def recover(self, pipeline_id: str, apply: bool = False, reason: str | None = None,
                approved_plan: Mapping[str, Any] | None = None) -> RecoverReport:
        """Resolve in-doubt branches and unfinished batches now (``apply``), exactly as the pipeline's next attempt
        would, or show what that would do (the default).

        Applying takes the epoch (fencing any running attempt) in the same store transaction that writes the
        audit row (what it is about to do), then runs the attempt's step 2,
        :func:`~airflow_eo.core.protocol.recover_pipeline`, without a run of its own: branches of
        committed batches are committed, every other branch rolled back, batches the sink committed
        rolled forward, every other unfinished batch aborted; the audit row then records what it did.

        :param pipeline_id: the pipeline.
        :param apply: change the sink and the store (else a dry run).
        :param reason: why (required to apply; recorded in the audit row).
        :param approved_plan: the plan a person approved (:func:`recovery_plan` of the dry run they read): applied
            only while recovery would do exactly that, checked before and again after the epoch is taken (a batch
            planned or prepared since is nobody's to abort); else :class:`OperationError`, nothing changed.
        """
        if apply and not (reason or "").strip():
            raise OperationError("recover --apply needs --reason TEXT (recorded in the audit log)")
        info = self.store.pipeline(pipeline_id)
        if info.mode is Mode.INTERVAL:
            raise OperationError(f"pipeline {pipeline_id!r} runs in interval mode: an interval's unfinished batch is "
                                 "resumed by that interval's next run, and its (upsert) sink leaves nothing in doubt")
        if info.sink is None:
            raise OperationError(f"the offset store does not know pipeline {pipeline_id!r}'s sink (its last run "
                                 "predates sink recording), so it cannot run the sink's recovery; the pipeline's "
                                 "next run recovers it")
        notes: list[str] = []
        before = RecoverReport(pipeline_id, True, None, self._in_doubt(info, notes), self._unfinished(info, notes))
        if not apply:
            return before
        assert reason is not None
        _check_approved(approved_plan, before, "since the dry run that was approved")
        if not before.branches and not before.batches:  # nothing to do: fence no running attempt for nothing
            return replace(before, dry_run=False)
        sink = self.connections.sink(pipeline_id, info.sink)
        # Fences every running attempt (owner and sink unchanged); on record before anything changes.
        epoch = self.store.take_audited(pipeline_id, self.actor, "recover", reason.strip(),
                                        {**_recovery_details(before), "completed": False})
        log.info("pipeline %s taken with epoch %d to recover it", pipeline_id, epoch)
        if approved_plan is not None:  # an attempt that planned between the check and the take: fenced, not undone
            _check_approved(approved_plan, RecoverReport(pipeline_id, True, None, self._in_doubt(info, notes),
                                                         self._unfinished(info, notes)),
                            f"while the pipeline was being taken (epoch {epoch} taken, nothing else changed)")
        # Recovery itself; the report is what it decided and did (its decisions, returned), with each branch's age.
        # The batch rows as recovery finds them (newest first; in-doubt branches are of recent batches).
        found = {b.record.batch_id: b for b in self.store.batch_history(pipeline_id, RECENT_BATCHES)}
        recovery = recover_pipeline(self.store, sink, pipeline_id, epoch, run_id=None)
        now = datetime.now(timezone.utc)
        branches = [InDoubtBranch(d, _age(d.epoch, found.get(d.batch_id), now)) for d in recovery.branches]
        batches = [UnfinishedBatch(found[d.batch_id].record, found[d.batch_id].updated_at, d.action, d.reason)
                   for d in recovery.batches if d.batch_id in found]
        left = [b.decision.xid for b in self._in_doubt(info, notes)]
        report = RecoverReport(pipeline_id, False, epoch, branches, batches, left)
        self.store.complete_audit(pipeline_id, epoch, "recover", {**_recovery_details(report), "completed": True})
        return report

    def rewind(self, pipeline_id: str, target: RewindTarget, *, apply: bool = False, reason: str | None = None,
               allow_double_count: bool = False) -> RewindReport:
        """Move the committed offsets (``apply``), or show what that would do (the default).

        Applying takes the epoch (fencing any running attempt) in the same store transaction that
        moves the offsets and records the audit row; it is refused while a batch is unfinished, for
        interval-mode pipelines, and, when it reprocesses offsets, for accumulating sinks unless
        ``allow_double_count`` (:func:`~airflow_eo.core.rewind.check_rewind`).

        :param pipeline_id: the pipeline.
        :param target: where to.
        :param apply: change the store (else a dry run).
        :param reason: why (required to apply; recorded in the audit row).
        :param allow_double_count: reprocess into an accumulating sink anyway.
        """
        info = self.store.pipeline(pipeline_id)
        committed = self.store.committed_offsets(pipeline_id)
        latest = self.store.batch_history(pipeline_id, 1)
        topics = _topics(committed, latest[0] if latest else None)
        if not topics:
            raise OperationError(f"pipeline {pipeline_id!r} has not planned any batch yet: there is nothing to rewind")
        broker = self._require_broker(topics)
        at_time = None
        if target.kind is RewindKind.DATETIME:
            if target.at is None:
                raise OperationError("a rewind to a datetime needs the datetime (RewindTarget.at is None)")
            source = self.source()
            at_time = source.offsets_for_time(source.partitions(topics), int(target.at.timestamp() * 1000))
        plan = plan_rewind(pipeline_id, target, list(broker.values()), committed, at_time)
        refusal = None
        try:
            check_rewind(plan, info.mode, self.store.unfinished_batches(pipeline_id), info.sink, allow_double_count)
        except OperationError as exc:
            refusal = str(exc)
        if not apply:
            return RewindReport(plan, False, refusal)
        if refusal is not None:
            raise OperationError(refusal)
        if not plan.moved:
            return RewindReport(plan, False, notes=["every partition is already there: nothing to change"])
        if not reason or not reason.strip():
            raise OperationError("a rewind that changes offsets needs --reason (recorded in the audit log)")
        group = self._kafka_group(pipeline_id, info)
        moved_group = False

        def move_group() -> None:
            # Recovery compares unfinished batches with the group's offsets: they follow the store's. Moved last,
            # under the store's lock once its checks passed: a refused rewind never moves the group (a partition
            # the store never committed has no group offset to go back to).
            nonlocal moved_group
            if group is not None:
                moved_group = True
                group.move_group_offsets({(c.topic, c.partition): c.new for c in plan.moved})

        try:
            epoch = self.store.rewind(plan, self.actor, reason.strip(), check=lambda found, unfinished: check_rewind(
                plan, found.mode, unfinished, found.sink, allow_double_count),
                overrides=[DOUBLE_COUNT_FLAG] if allow_double_count else [], before_commit=move_group)
        except BaseException:
            if group is not None and moved_group:  # the store's commit failed: put the group back where it is
                try:
                    group.move_group_offsets({(c.topic, c.partition): c.old for c in plan.moved if c.old is not None})
                except Exception:  # the store's failure is what to report; this only needs saying
                    log.exception("could not move the Kafka group of %s back to the store's offsets: run the rewind "
                                  "again, or `airflow eo recover` before the pipeline's next run", pipeline_id)
            raise
        notes = []
        if group is None:
            # Every other sink's offsets are mirrored into the same group for lag tools: it follows the rewind now
            # rather than at the next run (best effort: the store is the truth and already moved).
            try:
                self.source().mirror_group_offsets(pipeline_id, self.store.committed_offsets(pipeline_id))
            except Exception as exc:
                notes.append(f"the consumer group {group_id(pipeline_id)} still shows the old offsets "
                             f"({self._said(exc, 'group mirror')}); the next run moves it")
        return RewindReport(plan, True, epoch=epoch, notes=notes)

    # ------------------------------------------------------------------ helpers

    def _said(self, exc: Exception, what: str) -> str:
        """What a note says of an error: its text, or (without ``error_details``) its kind and the reference under
        which its text was logged here."""
        if self.error_details:
            return str(exc)
        reference = uuid.uuid4().hex[:8]
        log.warning("%s could not be read (reference %s)", what, reference, exc_info=exc)
        return f"{type(exc).__name__}; the details are in the log (reference {reference})"

    def _broker_offsets(self, topics: Sequence[str]) -> tuple[dict[TopicPartition, PartitionOffsets] | None,
                                                               str | None]:
        """Log-start and last stable offsets of the topics' partitions; (None, why) when Kafka cannot tell."""
        if not topics:
            return {}, None
        try:
            source = self.source()
        except Exception as exc:
            return None, f"Kafka offsets unknown: {self._said(exc, 'Kafka offsets')}"
        found: dict[TopicPartition, PartitionOffsets] = {}
        missing = []
        for topic in topics:  # one topic at a time: a deleted topic must not hide the others
            try:
                found.update({p.key: p for p in source.partition_offsets([topic], "earliest")})
            except ConfigurationError:
                missing.append(topic)
            except Exception as exc:
                return None, f"Kafka offsets unknown: {self._said(exc, 'Kafka offsets of ' + topic)}"
        return found, (f"topic(s) {', '.join(missing)} not found on the broker" if missing else None)

    def _require_broker(self, topics: Sequence[str]) -> dict[TopicPartition, PartitionOffsets]:
        broker, note = self._broker_offsets(topics)
        if broker is None or note:
            raise OperationError(f"cannot plan a rewind: {note}")
        return broker

    def _kafka_group(self, pipeline_id: str, info: PipelineInfo) -> ConsumerGroupSink | None:
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None or not capabilities.consumer_group:
            return None
        return role(self.connections.sink(pipeline_id, info.sink), ConsumerGroupSink)

    def _table(self, info: PipelineInfo) -> TableCommitSink | None:
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None or not capabilities.table_commits:
            return None
        return role(self.connections.sink(info.pipeline_id, info.sink), TableCommitSink)

    def _unfinished(self, info: PipelineInfo, notes: list[str]) -> list[UnfinishedBatch]:
        """The unfinished batches and what recovery does with each (a Kafka sink may have committed one)."""
        batches = self.store.unfinished_batches(info.pipeline_id)
        if not batches:
            return []
        committed: set[int] = set()
        group = self._kafka_group(info.pipeline_id, info)
        if group is not None:
            try:
                committed = group.committed_batches(batches)
            except Exception as exc:
                notes.append(f"the Kafka sink's group offsets are unknown ({self._said(exc, 'group offsets')}): a "
                             "batch it committed would be "
                             "rolled forward by recovery, not aborted")
        table = self._table(info)
        if table is not None:
            try:
                committed = table.committed_batches(batches)
            except Exception as exc:
                notes.append(f"the sink's table is unknown ({self._said(exc, 'table')}): a batch it committed would "
                             "be rolled forward by recovery, not aborted")
        when = {b.record.batch_id: b.updated_at
                for b in self.store.batch_history(info.pipeline_id, len(batches), [b.batch_id for b in batches])}
        return [UnfinishedBatch(b, when.get(b.batch_id), *decide_unfinished(b, committed)) for b in batches]

    def _in_doubt(self, info: PipelineInfo, notes: list[str]) -> list[InDoubtBranch]:
        """The pipeline's prepared branches on its sink's server, each with recovery's decision and its age."""
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None or not capabilities.in_doubt_branches:
            return []  # only two-phase sinks prepare branches
        sink = role(self.connections.sink(info.pipeline_id, info.sink), InDoubtSink)
        xids = sink.in_doubt(info.pipeline_id)
        batch_ids = sorted({x.batch_id for x in xids})
        found = {b.record.batch_id: b for b in self.store.batch_history(info.pipeline_id, len(batch_ids), batch_ids)}
        now = datetime.now(timezone.utc)
        return [InDoubtBranch(decide_branch(x, found[x.batch_id].record if x.batch_id in found else None),
                              _age(x.epoch, found.get(x.batch_id), now)) for x in xids]


# --------------------------------------------------------------------------- JSON shapes


def batch_dict(batch: BatchInfo) -> dict[str, Any]:
    """A batch as ``history`` shows it."""
    b, s = batch.record, batch.record.summary
    return {"batch_id": b.batch_id, "run_id": b.run_id, "state": b.state.value, "epoch": b.epoch,
            "ranges": [_range(r) for r in b.ranges], "skipped": [_range(r) for r in b.skipped],
            "interval": None if b.interval is None else str(b.interval),
            "records_in": s.records_in if s else None, "rows_out": s.rows_out if s else None,
            "dead_letters": s.dead_letters if s else None, "duplicates": s.duplicates if s else None,
            "seconds": dict(s.seconds) if s else {},
            "resumed": bool(s and s.resumed), "replayed": bool(s and s.replayed),
            "rolled_forward": bool(s and s.rolled_forward),
            "created_at": _iso(batch.created_at), "committed_at": _iso(batch.committed_at)}


def audit_dict(entry: AuditEntry) -> dict[str, Any]:
    """An audit entry as ``history`` shows it (``changes``: its details as lines people read)."""
    return {"audit_id": entry.audit_id, "at": _iso(entry.at), "actor": entry.actor, "action": entry.action,
            "reason": entry.reason, "epoch": entry.epoch, "details": dict(entry.details),
            "changes": audit_lines(entry.action, entry.details)}


def audit_lines(action: str, details: Mapping[str, Any]) -> list[str]:
    """What an audit entry changed, one line per partition, branch or batch (``airflow eo history``, the tab)."""
    lines: list[str] = []
    if action == "rewind":
        lines = [f"{p['topic']}[{p['partition']}] {p['old']} -> {p['new']}"
                 for p in details.get("partitions", []) if p["old"] != p["new"]]
        lines += [f"overridden: {flag}" for flag in details.get("overrides", [])]
    elif action == "recover":
        lines = [f"branch {b['xid']}: {b['action']}" for b in details.get("branches", [])]
        lines += [f"batch {b['batch_id']}: {b['recover']}" for b in details.get("batches", [])]
        if details.get("completed") is False:  # the recovery stopped midway: these were its plan
            lines = ["started, not completed; it set out to do:", *lines]
    return lines


def _recovery_details(report: RecoverReport) -> dict[str, Any]:
    return {"branches": [b.to_dict() for b in report.branches], "batches": [b.to_dict() for b in report.batches]}


def _pipeline(info: PipelineInfo) -> dict[str, Any]:
    sink = info.sink
    return {"pipeline_id": info.pipeline_id, "owner": info.owner, "mode": info.mode.value if info.mode else None,
            "epoch": info.epoch, "taken_at": _iso(info.taken_at),
            "sink": None if sink is None else {"kind": sink.kind, "target": sink.target, "conn_id": sink.conn_id,
                                               "accumulating": sink.accumulating,
                                               "dead_letter_table": sink.dead_letter_table}}


def _range(r: OffsetRange) -> dict[str, Any]:
    return {"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset, "until_offset": r.until_offset}


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="milliseconds")


def _total(partitions: Sequence[PartitionStatus]) -> int | None:
    lags = [p.lag for p in partitions]
    return None if any(lag is None for lag in lags) else sum(lag for lag in lags if lag is not None)


def _topics(committed: Mapping[TopicPartition, int], latest: BatchInfo | None) -> list[str]:
    """The pipeline's topics as the store knows them: committed partitions and its newest batch's ranges."""
    found = {t for t, _ in committed}
    if latest is not None:
        found.update(r.topic for r in (*latest.record.ranges, *latest.record.skipped))
    return sorted(found)


def _age(epoch: int, batch: BatchInfo | None, now: datetime) -> float | None:
    """How long the branch has been in doubt, about (:func:`~airflow_eo.core.orphans.branch_age` from its batch
    row); None without one."""
    if batch is None:
        return None
    return branch_age(None, epoch, batch.record.epoch, batch.created_at, batch.updated_at, now)


def _dead_letter(row: Mapping[str, Any]) -> dict[str, Any]:
    def text(value: Any) -> str | None:
        if value is None:
            return None
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes | bytearray) else str(value)

    try:  # None: not kept (a row written before the table had the column)
        headers = decode_headers(row.get("kafka_headers"))
    except ValueError:
        headers = None
    created = row.get("created_at")
    return {"batch_id": row["batch_id"], "topic": row["topic"], "partition": row["kafka_partition"],
            "offset": row["kafka_offset"], "key": text(row["record_key"]), "value": text(row["raw_value"]),
            "headers": None if headers is None else [{"key": k, "value": text(v)} for k, v in headers],
            "error": row["error"], "created_at": created.isoformat() if isinstance(created, datetime) else created}


def recovery_plan(report: RecoverReport) -> dict[str, list[list[Any]]]:
    """What a recovery does, as an approver approves it: each in-doubt branch's xid and action, each unfinished
    batch's id, epoch, run and action (JSON, for an XCom)."""
    return {"branches": sorted([b.decision.xid, b.decision.action.value] for b in report.branches),
            "batches": sorted([b.record.batch_id, b.record.epoch, b.record.run_id, b.action.value]
                              for b in report.batches)}


def _check_approved(approved: Mapping[str, Any] | None, fresh: RecoverReport, when: str) -> None:
    """Refuse a recovery that is not the approved one (:func:`recovery_plan`)."""
    if approved is None:
        return
    given = {key: sorted(list(item) for item in approved.get(key) or []) for key in ("branches", "batches")}
    now = recovery_plan(fresh)
    if given != now:
        raise OperationError(f"pipeline {fresh.pipeline_id!r}: the recovery changed {when}: approved {given}, now "
                             f"{now}. Nothing was applied; run the dry run again and have it approved")
