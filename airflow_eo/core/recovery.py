"""The recovery decisions, as plain functions over plain data: each written once, applied by
:func:`airflow_eo.core.protocol.recover_pipeline` (a task attempt's step 2, ``airflow eo recover``) and shown by
``airflow eo status`` and the DAG tab before anything is done.

What happens to an in-doubt branch of a two-phase sink (:func:`decide_branch`), which unfinished batches a sink
that owns its commit point already committed (:func:`committed_by_kafka`), and what becomes of every unfinished
batch (:func:`decide_unfinished`). No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.errors import TableMarkerError
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.xid import Xid

if TYPE_CHECKING:
    from airflow_eo.core.planning import Interval

# --------------------------------------------------------------------------- in-doubt XA branches


class BranchAction(str, Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class BranchDecision:
    """What recovery does with one prepared XA branch of the pipeline, and why."""

    xid: str
    batch_id: int
    epoch: int
    partition: int
    action: BranchAction
    reason: str


def decide_branch(xid: Xid, batch: BatchRecord | None) -> BranchDecision:
    """Commit a prepared branch if its batch is committed and lists the xid, else roll it back.

    The store's commit point decides: a batch counts once committed, and then exactly with the
    branches it recorded. Every recovery of an XA sink (a task attempt's step 2, ``airflow eo recover``)
    and every report of what it would do (``airflow eo status``) goes through here.

    :param xid: the prepared branch (``XA RECOVER``).
    :param batch: its batch's row in the store (``xid.batch_id``), None when there is none.
    """
    b = xid.batch_id
    if batch is None:
        action, reason = BranchAction.ROLLBACK, (f"batch {b} is not in the offset store (forgotten, or never "
                                                 "recorded): nothing of it counts")
    elif batch.state == BatchState.COMMITTED and xid.encode() in batch.xids:
        action, reason = BranchAction.COMMIT, (f"batch {b} passed its commit point and recorded this branch: "
                                               "its rows count, only the XA COMMIT is missing")
    elif batch.state == BatchState.COMMITTED:
        action, reason = BranchAction.ROLLBACK, (f"batch {b} committed without this branch (a failed Spark task's "
                                                 "or an older attempt's): its rows are not part of the batch")
    elif batch.state == BatchState.ABORTED:
        action, reason = BranchAction.ROLLBACK, f"batch {b} was aborted"
    else:
        action, reason = BranchAction.ROLLBACK, (f"batch {b} is {batch.state.value} and never reached its commit "
                                                 "point: its records are written again when the batch runs again")
    return BranchDecision(xid.encode(), b, xid.epoch, xid.partition, action, reason)


# --------------------------------------------------------------------------- unfinished batches


def committed_by_kafka(unfinished: Sequence[BatchRecord], group_offsets: Mapping[TopicPartition, int]) -> set[int]:
    """The unfinished batches a Kafka transactional sink committed (its commit point) but the store did not.

    Kafka committed a batch when the pipeline's consumer group reached the end of each of its
    non-empty ranges: the group's offsets move only inside the batch's transaction.

    :param unfinished: the store's unfinished batches of the pipeline.
    :param group_offsets: the group's committed offsets (``read_committed``, stable).
    """
    committed = set()
    for batch in unfinished:
        moved = [r for r in batch.ranges if r.size > 0]
        if moved and all(group_offsets.get(r.key) == r.until_offset for r in moved):
            committed.add(batch.batch_id)
    return committed


@dataclass(frozen=True)
class TableTransaction:
    """The identity a table format's idempotent commit carries (Delta's ``txnAppId`` / ``txnVersion``): the table
    keeps the highest version committed per app id and skips a write whose version is not above it.

    One app id per pipeline in continuous mode (batch ids only grow); one per data interval in interval mode, so that
    a backfill of an older interval (a batch id of its own, possibly below a newer interval's) is never skipped as
    already seen, while a replay of the same interval (its recorded batch id) is.
    """

    app_id: str
    version: int


def table_transaction(pipeline_id: str, batch_id: int, interval: Interval | None) -> TableTransaction:
    """The table commit identity of a batch (:class:`TableTransaction`)."""
    app_id = f"airflow_eo.{pipeline_id}"
    if interval is not None:
        app_id += f".{interval.start.isoformat()}/{interval.end.isoformat()}"
    return TableTransaction(app_id, batch_id)


def committed_by_table(unfinished: Sequence[BatchRecord], versions: Mapping[str, int | None],
                       table: str = "the table") -> set[int]:
    """The unfinished batches a table sink committed (its commit point) but the store did not: those whose app id's
    committed version (``versions``, None where the table has none) reached their batch id.

    :param unfinished: the store's unfinished batches of the pipeline.
    :param versions: the table's committed version per app id of these batches (:func:`table_transaction`).
    :raises TableMarkerError: a version above the newest unfinished batch, which is the store's newest planned one
        (continuous mode; interval mode: an interval's batch id never changes): a batch the store never planned.
    """
    committed = set()
    newest = max((b.batch_id for b in unfinished), default=None)
    for batch in unfinished:
        txn = table_transaction(batch.pipeline_id, batch.batch_id, batch.interval)
        version = versions.get(txn.app_id)
        if version is not None and newest is not None:
            check_table_claim(table, txn, version, newest)
        if version is not None and version >= txn.version:
            committed.add(batch.batch_id)
    return committed


def table_claim(marker: object) -> int | None:
    """A table's batch marker (a snapshot's ``airflow-eo.batch``, a ``txn`` version) as a batch id; None for what is
    no batch id (another writer's property, never ours): ignored, not raised on, so that no foreign value stops every
    attempt."""
    if isinstance(marker, bool):
        return None
    if isinstance(marker, int):
        return marker if marker >= 0 else None
    text = marker.strip() if isinstance(marker, str) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


def check_table_claim(table: str, txn: TableTransaction, claimed: int, newest_planned: int) -> None:
    """Refuse a table that claims, under ``txn``'s app id, a batch above the store's newest planned one
    (``newest_planned``: the batch an attempt writes is the newest the store planned; a stale attempt of an older
    batch is fenced anyway): trusting it would skip every batch up to it, offsets advancing with nothing written."""
    if claimed > newest_planned:
        raise TableMarkerError(
            f"{table} claims batch {claimed} of {txn.app_id}, above the newest batch the offset store planned "
            f"({newest_planned}): a marker this pipeline did not write (another writer of the table set it, or the "
            "offset store is not the one the table was written with). Nothing is written. Remove the marker (a "
            "Delta txn / Iceberg snapshot property of that app id), point the pipeline at its own store or table, "
            "or use a new pipeline_id")


class BatchAction(str, Enum):
    ROLL_FORWARD = "roll forward"
    RESUME = "resume"
    ABORT = "abort"


@dataclass(frozen=True)
class BatchDecision:
    """What recovery does with one unfinished batch of the pipeline, and why."""

    batch_id: int
    run_id: str
    action: BatchAction
    reason: str


def decide_unfinished(batch: BatchRecord, committed_by_sink: set[int] | frozenset[int],
                      run_id: str | None = None) -> tuple[BatchAction, str]:
    """What recovery (:func:`~airflow_eo.core.protocol.recover_pipeline`) does with an unfinished batch, and why.

    :param batch: the unfinished batch.
    :param committed_by_sink: ids of the batches the sink reports committed (its own commit point).
    :param run_id: the run of the recovering task attempt; None for ``airflow eo recover`` (no run of its own).
    """
    if batch.batch_id in committed_by_sink:
        return BatchAction.ROLL_FORWARD, ("the sink committed it (its own commit point) but the store did not "
                                          "record it: the store records it now")
    if run_id is not None and batch.run_id == run_id:
        return BatchAction.RESUME, (f"{batch.state.value} by an earlier attempt of this run: resumed with its "
                                    "recorded ranges")
    return BatchAction.ABORT, (f"{batch.state.value}, never committed: aborted (its branches rolled back); "
                               "its ranges are planned again by the next run")


@dataclass(frozen=True)
class SinkRecovery:
    """What a sink's ``recover`` did: its decision on each in-doubt branch it resolved, and the unfinished batches
    it had committed itself (a sink that owns its commit point), which the store then records."""

    branches: tuple[BranchDecision, ...] = ()
    committed: frozenset[int] = frozenset()
