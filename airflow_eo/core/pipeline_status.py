"""What the offset store holds of a pipeline, as the operations read it, and where each partition stands.

The store's read models (:class:`PipelineInfo`, :class:`BatchInfo`, :class:`AuditEntry`) and a partition's lag
(:func:`partition_status`). No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_eo.core.batch import BatchRecord, Owner
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.planning import PartitionOffsets
from airflow_eo.core.ranges import TopicPartition

# --------------------------------------------------------------------------- what the store holds


@dataclass(frozen=True)
class PipelineInfo:
    """A row of ``eo_pipeline``: the pipeline's fencing epoch, who runs it, how, and into which sink."""

    pipeline_id: str
    epoch: int
    owner: str | None  # as people read it, ``<dag_id>.<task_id>``
    mode: Mode | None
    taken_at: datetime | None
    sink: SinkRecord | None  # None: its last take predates sink recording
    owned_by: Owner | None = None  # None: no owner, or recorded before the store kept the ids apart (see owner)
    retired_at: datetime | None = None  # set: retired (``airflow eo retire``), its takes are refused


@dataclass(frozen=True)
class BatchInfo:
    """A row of ``eo_batch`` with its timestamps (UTC)."""

    record: BatchRecord
    created_at: datetime | None
    updated_at: datetime | None
    committed_at: datetime | None

    @property
    def last_change(self) -> datetime | None:
        return self.committed_at or self.updated_at or self.created_at


@dataclass(frozen=True)
class AuditEntry:
    """A row of ``eo_audit``: an operation a person ran on the pipeline (rewind, recover)."""

    audit_id: int
    pipeline_id: str
    at: datetime | None
    actor: str
    action: str
    reason: str | None
    epoch: int | None
    details: Mapping[str, Any]


# --------------------------------------------------------------------------- partitions and lag


@dataclass(frozen=True)
class PartitionStatus:
    """One partition of a pipeline: its committed offset next to what the broker holds.

    :param committed: the next offset the pipeline processes; None when it never committed the partition.
    :param log_start: the earliest offset the broker still stores (None: unknown).
    :param last_stable: the end for ``read_committed`` readers (None: unknown).
    """

    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    last_stable: int | None

    @property
    def lag(self) -> int | None:
        """Offsets not processed yet that can still be read (an upper bound of records)."""
        if self.last_stable is None or self.log_start is None:
            return None
        start = self.log_start if self.committed is None else max(self.committed, self.log_start)
        return max(0, self.last_stable - start)

    @property
    def lost(self) -> int:
        """Offsets deleted by retention before the pipeline read them (the next batch fails or skips them)."""
        if self.committed is None or self.log_start is None:
            return 0
        return max(0, self.log_start - self.committed)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "committed": self.committed,
                "last_stable": self.last_stable, "log_start": self.log_start, "lag": self.lag, "lost": self.lost}


def partition_status(partitions: Sequence[PartitionOffsets] | None,
                     committed: Mapping[TopicPartition, int]) -> list[PartitionStatus]:
    """Every partition the store or the broker knows of the pipeline's topics, sorted.

    :param partitions: what the broker says of the topics' partitions; None when it could not be asked.
    :param committed: the pipeline's committed offsets.
    """
    broker = {p.key: p for p in partitions or ()}
    return [PartitionStatus(key[0], key[1], committed.get(key),
                            broker[key].log_start if key in broker else None,
                            broker[key].last_stable if key in broker else None)
            for key in sorted(set(broker) | set(committed))]
