"""In-doubt work of ours wherever it is, whatever pipeline left it (issue 44): the decisions of ``airflow eo verify
--all`` and ``airflow eo recover --orphans``, as plain functions over plain data. No I/O here.

A prepared branch (an XA branch, a PostgreSQL prepared transaction) carries our prefix and the pipeline's key
(:mod:`airflow_eo.core.xid`), so it is found without the pipeline: every database the store's pipelines recorded as
their sink's is scanned by prefix (:class:`InDoubtServer`), each branch is attributed to the store's pipeline whose
key it carries (:func:`owner_of`, else "unknown pipeline") and decided by the store the way recovery decides a
pipeline's own (:func:`decide_orphan` over :func:`~airflow_eo.core.recovery.decide_branch`).

Acting on them (``recover --orphans --apply``) is safe only for a branch that is not in flight: it must be listed by
two scans with a pause between (:func:`seen_in_both`), be older than the threshold, and its pipeline's epoch is taken
(fencing any attempt that could still commit its batch) before its batch row is read again and decides. A branch
whose pipeline this store never knew may be another store's pipeline's: it is left alone unless the operator says so.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Protocol, TypeVar, runtime_checkable

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.errors import OperationError
from airflow_eo.core.recovery import BranchAction, decide_branch
from airflow_eo.core.xid import Xid, pipeline_key

#: What people call a pipeline the store never knew.
UNKNOWN_PIPELINE = "unknown pipeline"
#: ``--older-than`` when not given: 10 minutes (a batch takes seconds to minutes between prepare and commit).
DEFAULT_OLDER_THAN_S = 600.0

T = TypeVar("T", bound=Hashable)

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")


def parse_duration(text: str) -> float:
    """``--older-than``: seconds (``600``), or a number with a unit (``30s``, ``10m``, ``2h``, ``1d``); ``0``: all.

    :raises OperationError: saying what is expected.
    """
    match = _DURATION.fullmatch(str(text).lower())
    if match is None:
        raise OperationError(f"--older-than {text!r} is not a duration: give seconds (600) or a number with a unit "
                             "s, m, h or d (10m, 2h); 0 reports everything")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class ScannedBranch:
    """One of our prepared branches as its database lists it.

    :param xid: its id (our prefix, the pipeline's key, the batch, the attempt).
    :param prepared_at: when it was prepared, where the database says (PostgreSQL does; ``XA RECOVER`` does not).
    :param locks: what it holds locked, where the database says (PostgreSQL's ``pg_locks``); None: not said.
    """

    xid: Xid
    prepared_at: datetime | None = None
    locks: tuple[str, ...] | None = None


@runtime_checkable
class InDoubtServer(Protocol):
    """One database's in-doubt branches, all pipelines' (a two-phase sink's adapter plays it)."""

    def in_doubt_server(self) -> str:
        """Which database the branches are on (``MySQL host:port``, ``PostgreSQL host:port/database``): two
        connections reaching it are one database to scan."""

    def in_doubt_branch_name(self) -> str:
        """What the database calls a branch (``prepared XA branch``, ``prepared transaction``)."""

    def scan_in_doubt(self) -> list[ScannedBranch]:
        """Every prepared branch carrying our prefix on the database, of any pipeline."""

    def end_branch(self, xid: Xid, action: BranchAction) -> bool:
        """Commit or roll back one prepared branch; False when the database no longer knows it (ended before)."""


class OrphanAction(str, Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    LEAVE = "leave"  # not ours to decide: a pipeline this store never knew


@dataclass(frozen=True)
class Orphan:
    """An in-doubt branch found on a database, attributed and decided."""

    database: str  # where: the sink connection(s) that reach it and the server
    branch: str  # what the database calls it (XA branch, prepared transaction)
    xid: Xid
    pipeline_id: str | None  # None: the store never knew its pipeline
    age_seconds: float | None  # None: neither the database nor the store says
    locks: tuple[str, ...] | None
    action: OrphanAction
    reason: str

    @property
    def pipeline(self) -> str:
        return self.pipeline_id if self.pipeline_id is not None else UNKNOWN_PIPELINE

    def to_dict(self) -> dict[str, Any]:
        return {"database": self.database, "branch": self.branch, "xid": self.xid.encode(),
                "pipeline_id": self.pipeline_id, "pipeline": self.pipeline, "batch_id": self.xid.batch_id,
                "epoch": self.xid.epoch, "partition": self.xid.partition,
                "age_seconds": None if self.age_seconds is None else round(self.age_seconds, 1),
                "locks": None if self.locks is None else list(self.locks),
                "action": self.action.value, "reason": self.reason}


@runtime_checkable
class OpenTransactionServer(Protocol):
    """A Kafka transactional sink's output topic: where its pipeline's transactions stay open (the Kafka sink's
    adapter plays it)."""

    def in_doubt_server(self) -> str: ...

    def transactional_id(self) -> str: ...

    def open_transactions(self) -> dict[tuple[str, int], tuple[int, int]]:
        """The output topic's partitions where a transaction is open: (last stable offset, end offset)."""

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        """The unfinished batches Kafka committed (its commit point) but the store did not."""


@dataclass(frozen=True)
class OpenTransaction:
    """A Kafka transaction left open on a Kafka-sink pipeline's output topic: ``read_committed`` readers of the
    partition stop at its first offset until the broker aborts it (``transaction.timeout.ms``) or the pipeline's
    next producer (``init_transactions``, what ``airflow eo recover`` runs) does."""

    database: str  # the cluster
    pipeline_id: str
    transactional_id: str
    topic: str
    partition: int
    last_stable: int
    end: int
    batch_id: int | None  # the pipeline's unfinished batch it is (likely) of; None: none
    age_seconds: float | None
    action: str  # what `airflow eo recover PIPELINE` does: abort, roll forward
    reason: str

    @property
    def pipeline(self) -> str:
        return self.pipeline_id

    @property
    def key(self) -> str:
        return f"{self.transactional_id} {self.topic}[{self.partition}]"

    def to_dict(self) -> dict[str, Any]:
        return {"database": self.database, "branch": "open Kafka transaction", "xid": self.key,
                "pipeline_id": self.pipeline_id, "pipeline": self.pipeline_id, "batch_id": self.batch_id,
                "epoch": None, "partition": self.partition,
                "age_seconds": None if self.age_seconds is None else round(self.age_seconds, 1),
                "locks": [f"read_committed readers of {self.topic}[{self.partition}] stop at offset "
                          f"{self.last_stable} (end {self.end})"],
                "action": self.action, "reason": self.reason}


def decide_open_transaction(unfinished: Sequence[BatchRecord], committed_by_kafka: set[int]) -> tuple[
        int | None, str, str]:
    """Which batch an open transaction of a Kafka-sink pipeline is (likely) of, and what ``airflow eo recover``
    does: roll the batch forward if Kafka committed it (the group moved) — then the open one is a later attempt's —
    else abort it (``init_transactions`` of the pipeline's producer)."""
    rolled = sorted(committed_by_kafka)
    if rolled:
        return rolled[-1], "roll forward", (f"Kafka committed batch {rolled[-1]} (its group moved) and the store did "
                                            "not record it: recover records it and aborts the open transaction")
    if unfinished:
        newest = max(unfinished, key=lambda b: b.batch_id)
        return newest.batch_id, "abort", (f"batch {newest.batch_id} is {newest.state.value} and never committed: "
                                          "Kafka aborts its transaction after transaction.timeout.ms; recover "
                                          "(init_transactions) aborts it now and aborts the batch")
    return None, "abort", ("the pipeline has no unfinished batch (an attempt fenced before it recorded one, or "
                           "another producer writing the topic): Kafka aborts it after its timeout; recover "
                           "aborts the pipeline's own now")


def owner_of(xid: Xid, keys: Mapping[str, str], pipeline_ids: Iterable[str] = ()) -> str | None:
    """The store's pipeline whose key the branch carries, or None.

    :param keys: pipeline key (:func:`~airflow_eo.core.xid.pipeline_key`) -> pipeline id, of every pipeline.
    :param pipeline_ids: every pipeline id again, for a branch prepared with the short key of before issue 23
        (:meth:`~airflow_eo.core.xid.Xid.belongs_to`).
    """
    found = keys.get(xid.pipeline_key)
    if found is not None:
        return found
    return next((p for p in pipeline_ids if xid.belongs_to(p)), None)


def pipeline_keys(pipeline_ids: Iterable[str]) -> dict[str, str]:
    """pipeline key -> pipeline id (:func:`owner_of`)."""
    return {pipeline_key(p): p for p in pipeline_ids}


def decide_orphan(xid: Xid, pipeline_id: str | None, batch: BatchRecord | None,
                  unknown_rollback: bool = False, sink_database: str | None = None,
                  found_on: str | None = None) -> tuple[OrphanAction, str]:
    """What ``recover --orphans`` does with a branch, and why: the store's decision
    (:func:`~airflow_eo.core.recovery.decide_branch`) for a pipeline it knows; a pipeline it never knew is left alone
    (another store's, perhaps) unless ``unknown_rollback`` (``--unknown rollback``).

    :param batch: the branch's batch row in the store (None: none), read after the pipeline's epoch was taken when
        acting on it (no attempt of an earlier epoch can commit it then).
    :param sink_database: the database the store's pipeline writes to (its recorded sink's); with ``found_on``, the
        one the branch is on: when they differ the branch is left (a pipeline of the same id in another store,
        whose batches this store does not know, may have committed it).
    """
    if pipeline_id is not None and sink_database is not None and found_on is not None and sink_database != found_on:
        return OrphanAction.LEAVE, (f"pipeline {pipeline_id} of this offset store writes to {sink_database}, not "
                                    "here: the branch may be a same-named pipeline's of another store; left alone")
    if pipeline_id is None:
        if unknown_rollback:
            return OrphanAction.ROLLBACK, ("no pipeline of this offset store carries its key; rolled back as asked "
                                           "(--unknown rollback)")
        return OrphanAction.LEAVE, ("no pipeline of this offset store carries its key (another store's pipeline, or "
                                    "one whose rows are gone): left alone; --unknown rollback rolls it back")
    decision = decide_branch(xid, batch)
    return OrphanAction(decision.action.value), decision.reason


def branch_age(prepared_at: datetime | None, epoch: int, batch_epoch: int | None, created_at: datetime | None,
               updated_at: datetime | None, now: datetime) -> float | None:
    """How long a branch has been in doubt: since the database says it was prepared; else, about, since its batch
    row was last written by the attempt that prepared it (it planned or resumed the batch just before, and records
    or commits it just after), else since the batch was planned; None when neither says."""
    since = prepared_at
    if since is None:
        since = updated_at if batch_epoch == epoch else created_at
    return None if since is None else max(0.0, (now - since).total_seconds())


def seen_in_both(first: Iterable[T], second: Iterable[T]) -> set[T]:
    """The branches two scans both listed: only these are acted on (one a scan saw once may be in flight, about to
    be committed or rolled back by its attempt, or prepared since)."""
    return set(first) & set(second)


A = TypeVar("A", Orphan, OpenTransaction)


def overdue(orphans: Sequence[A], older_than_s: float) -> list[A]:
    """The orphans older than the threshold (``0``: all); one of unknown age counts (nobody can say it is young)."""
    return [o for o in orphans if older_than_s <= 0 or o.age_seconds is None or o.age_seconds > older_than_s]


def oldest_age_by_database(orphans: Sequence[Orphan | OpenTransaction], databases: Iterable[str]) -> dict[str, float]:
    """The gauge ``airflow_eo.in_doubt.oldest_age_seconds`` per database scanned: its oldest branch's age, 0 with
    none (so an alert clears once they are resolved); a branch of unknown age counts as 0."""
    oldest = {d: 0.0 for d in databases}
    for o in orphans:
        oldest[o.database] = max(oldest.get(o.database, 0.0), o.age_seconds or 0.0)
    return oldest
