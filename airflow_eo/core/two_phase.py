"""What every two-phase sink (MySQL XA, PostgreSQL ``PREPARE TRANSACTION``) does with its prepared branches, written
once over the one role a database's two-phase API plays (:class:`PreparedBranches`): recovery applies
:func:`~airflow_eo.core.recovery.decide_branch` to each, finalize commits the batch's branches after the commit point,
discard rolls back an attempt's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from airflow_eo.core.dedup import is_seen_id_partition
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.orphans import ScannedBranch
from airflow_eo.core.recovery import BranchAction, BranchDecision, decide_branch
from airflow_eo.core.xid import Xid

if TYPE_CHECKING:
    from airflow_eo.core.batch import BatchContext, BatchRecord

log = logging.getLogger(__name__)


class PreparedBranches(Protocol):
    """A database's two-phase API on one session (``mysql/xa.py`` XaFacade, ``postgres/prepared.py``)."""

    def recover(self, pipeline_id: str | None = None) -> list[Xid]:
        """Our prepared branches, of ``pipeline_id`` or of any pipeline, sorted."""

    def scan(self) -> list[ScannedBranch]:
        """Every prepared branch of ours on the database, of any pipeline, with what the database says of it
        (``airflow eo verify --all``)."""

    def commit(self, xid: Xid) -> bool:
        """Commit a prepared branch; False when the server no longer knows it (ended before)."""

    def rollback(self, xid: Xid) -> bool:
        """Roll back a prepared branch; False when the server no longer knows it (ended before)."""


def resolve_branches(branches: PreparedBranches, pipeline_id: str,
                     batch_lookup: Callable[[int], BatchRecord | None], what: str) -> tuple[BranchDecision, ...]:
    """Every prepared branch of the pipeline committed if its batch committed and lists it, else rolled back
    (:func:`~airflow_eo.core.recovery.decide_branch`); returns the decisions taken.

    :param what: what the database calls a branch, for the log (``XA branch``, ``prepared transaction``).
    """
    decisions: list[BranchDecision] = []
    ours = branches.recover(pipeline_id)
    if ours:
        log.warning("%d %s(s) of pipeline %s left by earlier attempts; resolving", len(ours), what, pipeline_id)
    records: dict[int, BatchRecord | None] = {}
    for xid in ours:
        if xid.batch_id not in records:
            records[xid.batch_id] = batch_lookup(xid.batch_id)
        decision = decide_branch(xid, records[xid.batch_id])
        if decision.action is BranchAction.COMMIT:
            branches.commit(xid)
        else:
            branches.rollback(xid)
        log.info("recovered %s %s of batch %d: %s (%s)", what, xid.encode(), xid.batch_id, decision.action.value,
                 decision.reason)
        decisions.append(decision)
    return tuple(decisions)


def commit_batch_branches(branches: PreparedBranches, batch: BatchRecord, xids: Sequence[str]) -> None:
    """After the commit point: commit the batch's recorded branches, then roll back its strays (branches that failed
    attempts prepared but nobody reported)."""
    for i, text in enumerate(xids):
        branches.commit(Xid.decode(text))
        if i == 0 and len(xids) > 1:
            failpoint("between_xa_commits")
    reported = set(xids)
    for xid in branches.recover(batch.pipeline_id):
        if xid.batch_id == batch.batch_id and xid.encode() not in reported:
            branches.rollback(xid)


def refused_write_branches(branches: PreparedBranches, batch: BatchContext) -> list[Xid]:
    """The branches a write job of this attempt prepared before its table refused a row: every branch of the batch and
    epoch but the seen ids a marking job wrote before it (those are committed with the batch). Void: a prepared
    branch keeps its row locks, and the probes and the next write's tasks of other numbers would wait on them."""
    return sorted(x for x in branches.recover(batch.pipeline_id)
                  if (x.batch_id, x.epoch) == (batch.batch_id, batch.epoch) and not is_seen_id_partition(x.partition))


def attempt_branches(branches: PreparedBranches, batch: BatchContext, xids: Sequence[str]) -> list[Xid]:
    """This attempt's branches of the batch: the reported ones, and those its Spark tasks prepared before the job
    failed (same batch and epoch: no other attempt's branch matches); what a discard rolls back."""
    ours = {Xid.decode(text) for text in xids}
    ours.update(x for x in branches.recover(batch.pipeline_id)
                if (x.batch_id, x.epoch) == (batch.batch_id, batch.epoch))
    return sorted(ours)
