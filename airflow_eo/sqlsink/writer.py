"""What every SQL partition writer shares (executor side; picklable, no Airflow): its fields, the stream of a
partition's non-empty Arrow batches, its branch id, and the rollback of an earlier attempt's prepared branch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_eo.core.two_phase import PreparedBranches
from airflow_eo.core.xid import Xid
from airflow_eo.sqlstore.fence import EpochFence


@dataclass(frozen=True, kw_only=True)
class SqlPartitionWriter:
    """Writes one Spark partition into ``table``; runs inside a Spark task (must stay picklable). A database's
    writer adds its own fields and ``__call__(batches, partition, stage_id, attempt_id, agreed=None)``."""

    connect_kwargs: Mapping[str, Any] = field(repr=False)  # holds the password
    table: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    updates: Mapping[str, str]
    pipeline_key: str
    batch_id: int
    epoch: int
    #: upsert sink where the offset store is: each write transaction first checks the attempt's epoch
    fence: EpochFence | None = None
    #: write the rows in one transaction and roll it back, whatever the sink kind: a probe for rows the table refuses
    #: (:mod:`airflow_eo.core.refused_rows`); earlier attempts' branches of the task are still rolled back first
    probe: bool = False

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        """Write the partition's rows (held uncommitted while the tasks vote when ``agreed`` is given): the xid of
        its prepared branch (two-phase) and the rows written."""
        raise NotImplementedError

    def refusal(self, exc: BaseException) -> str | None:
        """The database's error when ``exc`` is the table refusing a row's values (a constraint, a trigger, a value
        out of a column's range), else None (the connection, a lock, anything the same rows could pass on retry)."""
        return None

    def lock_waited(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this two-phase write's wait for a row lock running out
        (:data:`~airflow_eo.core.refused_rows.ROW_LOCK_WAIT_S`): perhaps another task's prepared branch holds it."""
        return False

    def xid(self, partition: int, stage_id: int, attempt_id: int) -> Xid:
        """This task attempt's branch id."""
        return Xid(self.pipeline_key, self.batch_id, self.epoch, partition, stage_id, attempt_id)


def nonempty(batches: Iterable[Any]) -> tuple[Any, Iterator[Any]] | None:
    """The first batch that holds rows and the stream of all that do (the first included); None when none does
    (nothing to write: no branch at all)."""
    rows = (b for b in batches if b.num_rows)
    first = next(rows, None)
    return None if first is None else (first, _chain(first, rows))


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def rollback_earlier_attempts(branches: PreparedBranches, xid: Xid) -> None:
    """Roll back the prepared branches of earlier attempts of ``xid``'s task: one that prepared and then died holds
    row locks this attempt would wait on (a prepared branch has no lock timeout of its own)."""
    for other in branches.recover():
        if (other.pipeline_key, other.batch_id, other.epoch, other.partition) == (
                xid.pipeline_key, xid.batch_id, xid.epoch, xid.partition) and other != xid:
            branches.rollback(other)
