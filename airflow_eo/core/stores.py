"""Offset store kinds, chosen by the connection type of the store's connection (``mysql`` by default; a new
database registers its own with :func:`register_store`, see ``docs/architecture.md``, "How to add a database").

:class:`ManagedOffsetStore` is what the operations (``airflow eo``, the DAG tab, sensors) read and change of a store,
beyond the protocol's :class:`~airflow_eo.core.protocol.OffsetStore` role.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.drivers import require_driver
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.pipeline_status import AuditEntry, BatchInfo, PipelineInfo
from airflow_eo.core.protocol import OffsetStore
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.rewind import RewindPlan


class ManagedOffsetStore(OffsetStore, Protocol):
    """An offset store as the operations use it: the protocol's role plus reads, the audit log and the rewind."""

    read_only: bool  # reads only: migrate() checks the schema instead of changing it

    def migrate(self) -> None: ...
    def close(self) -> None:
        """Close what the store keeps open in this process (idle connections); its next call opens anew."""
    def pipelines(self, pipeline_id: str | None = None) -> list[PipelineInfo]: ...
    def pipeline(self, pipeline_id: str) -> PipelineInfo: ...
    def all_committed_offsets(self) -> dict[str, dict[TopicPartition, int]]: ...
    def latest_batches(self) -> dict[str, BatchInfo]: ...
    def latest_committed_batch_id(self, pipeline_id: str) -> int | None: ...
    def batch_history(self, pipeline_id: str, limit: int, batch_ids: list[int] | None = None) -> list[BatchInfo]: ...
    def runs_recorded(self, pipeline_ids: Sequence[str], run_ids: Sequence[str]) -> dict[str, str]: ...
    def audit_log(self, pipeline_id: str, limit: int) -> list[AuditEntry]: ...
    def take_audited(self, pipeline_id: str, actor: str, action: str, reason: str,
                     details: dict[str, Any]) -> int: ...
    def record_audit(self, pipeline_id: str, actor: str, action: str, reason: str,
                     details: dict[str, Any]) -> None: ...
    def complete_audit(self, pipeline_id: str, epoch: int, action: str, details: dict[str, Any]) -> None: ...
    def rewind(self, plan: RewindPlan, actor: str, reason: str,
               check: Callable[[PipelineInfo, list[BatchRecord]], None], overrides: Sequence[str] = (),
               before_commit: Callable[[], None] | None = None) -> int: ...
    def retire(self, pipeline_id: str, actor: str, reason: str, expected_epoch: int | None,
               details: dict[str, Any]) -> int: ...
    def unretire(self, pipeline_id: str, actor: str, reason: str) -> int: ...
    def create_pipeline(self, pipeline_id: str) -> None: ...
    def rename(self, old: str, new: str, actor: str, reason: str, expected_epoch: int,
               check: Callable[[bool], None], before_commit: Callable[[], Any] | None = None) -> int: ...
    # ``airflow eo prune`` (:mod:`airflow_eo.core.history`): bounded reads and deletes
    def prune_facts(self, pipeline_id: str) -> tuple[int | None, int | None]: ...
    def prune_candidates(self, pipeline_id: str, after: int, below: int, cutoff: datetime,
                         limit: int) -> list[tuple[BatchRecord, datetime | None]]: ...
    def delete_batches(self, pipeline_id: str, batch_ids: Sequence[int], below: int, cutoff: datetime) -> int: ...
    def oldest_batch_time(self, pipeline_id: str, from_batch: int) -> datetime | None: ...
    def audit_candidates(self, pipeline_id: str, before: datetime, after_id: int, limit: int) -> list[int]: ...
    def delete_audit(self, pipeline_id: str, audit_ids: Sequence[int], before: datetime) -> int: ...


StoreFactory = Callable[[ConnectionInfo], ManagedOffsetStore]
_STORES: dict[str, StoreFactory] = {}


def register_store(conn_type: str, build: StoreFactory) -> None:
    """Register the offset store of a connection type (once per type)."""
    _STORES[conn_type] = build


def store_for(connection: ConnectionInfo) -> ManagedOffsetStore:
    """The offset store on ``connection``, by its connection type (a clear error when the type's driver is not
    installed: :func:`~airflow_eo.core.drivers.require_driver`)."""
    build = _STORES.get(connection.conn_type or "")
    if build is None:
        raise ConfigurationError(
            f"the offset store's connection {connection.conn_id!r} has type {connection.conn_type!r}; the offset "
            f"store runs on a connection of type {' or '.join(sorted(_STORES)) or '(none registered)'}")
    require_driver(connection.conn_type or "")
    return build(connection)
