"""What the operations return: each command's report (status, history, recover, rewind, verify, orphans, the UI's
page) and the JSON shapes of batches, audit entries and ranges that ``airflow eo`` prints and the tab shows.

Separate from the operations themselves (``service.py`` and its collaborators) so that the CLI, the plugin and
every operation share one set of read models without importing one another's I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.orphans import OpenTransaction, Orphan, oldest_age_by_database, overdue
from airflow_eo.core.pipeline_status import AuditEntry, BatchInfo, PartitionStatus, PipelineInfo
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.recovery import BatchAction, BranchDecision
from airflow_eo.core.rewind import RewindPlan
from airflow_eo.core.verify import Finding

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
                "ranges": [range_dict(r) for r in b.ranges], "updated_at": iso(self.updated_at),
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
                "last_at": iso(last.last_change) if last else None, "lag": self.lag}


@dataclass(frozen=True)
class PipelineStatus:
    """``airflow eo status``: partitions, the unfinished batch, in-doubt branches."""

    info: PipelineInfo
    partitions: list[PartitionStatus]
    unfinished: list[UnfinishedBatch]
    in_doubt: list[InDoubtBranch]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**pipeline_dict(self.info), "partitions": [p.to_dict() for p in self.partitions],
                "lag": total_lag(self.partitions), "unfinished": [u.to_dict() for u in self.unfinished],
                "in_doubt": [b.to_dict() for b in self.in_doubt], "notes": list(self.notes)}


@dataclass(frozen=True)
class History:
    """``airflow eo history``: batches and what people did, newest first."""

    info: PipelineInfo
    batches: list[BatchInfo]
    audit: list[AuditEntry]

    def to_dict(self) -> dict[str, Any]:
        return {**pipeline_dict(self.info), "batches": [batch_dict(b) for b in self.batches],
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



# --------------------------------------------------------------------------- JSON shapes


def batch_dict(batch: BatchInfo) -> dict[str, Any]:
    """A batch as ``history`` shows it."""
    b, s = batch.record, batch.record.summary
    return {"batch_id": b.batch_id, "run_id": b.run_id, "state": b.state.value, "epoch": b.epoch,
            "ranges": [range_dict(r) for r in b.ranges], "skipped": [range_dict(r) for r in b.skipped],
            "interval": None if b.interval is None else str(b.interval),
            "records_in": s.records_in if s else None, "rows_out": s.rows_out if s else None,
            "dead_letters": s.dead_letters if s else None, "duplicates": s.duplicates if s else None,
            "seconds": dict(s.seconds) if s else {},
            "resumed": bool(s and s.resumed), "replayed": bool(s and s.replayed),
            "rolled_forward": bool(s and s.rolled_forward),
            "created_at": iso(batch.created_at), "committed_at": iso(batch.committed_at)}


def audit_dict(entry: AuditEntry) -> dict[str, Any]:
    """An audit entry as ``history`` shows it (``changes``: its details as lines people read)."""
    return {"audit_id": entry.audit_id, "at": iso(entry.at), "actor": entry.actor, "action": entry.action,
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


def pipeline_dict(info: PipelineInfo) -> dict[str, Any]:
    sink = info.sink
    return {"pipeline_id": info.pipeline_id, "owner": info.owner, "mode": info.mode.value if info.mode else None,
            "epoch": info.epoch, "taken_at": iso(info.taken_at),
            "sink": None if sink is None else {"kind": sink.kind, "target": sink.target, "conn_id": sink.conn_id,
                                               "accumulating": sink.accumulating,
                                               "dead_letter_table": sink.dead_letter_table}}


def range_dict(r: OffsetRange) -> dict[str, Any]:
    return {"topic": r.topic, "partition": r.partition, "from_offset": r.from_offset, "until_offset": r.until_offset}


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="milliseconds")


def total_lag(partitions: Sequence[PartitionStatus]) -> int | None:
    lags = [p.lag for p in partitions]
    return None if any(lag is None for lag in lags) else sum(lag for lag in lags if lag is not None)


