"""The offset store's connection: its type chooses the database the store runs on."""

from __future__ import annotations

from functools import cached_property

from airflow.sdk import BaseHook

import airflow_eo.integrations  # noqa: F401  (registers every offset store kind)
from airflow_eo import DEFAULT_OFFSET_STORE_CONN_ID
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.stores import ManagedOffsetStore, store_for
from airflow_eo.hooks.connected_sinks import AirflowConnectionResolver


class OffsetStoreHook(BaseHook):
    """The durable offset store on the connection ``offset_store_conn_id`` (default ``eo_offset_store``): on MySQL /
    MariaDB for a ``mysql`` connection, on PostgreSQL for a ``postgres`` one (``airflow_eo.core.stores``).

    See ``docs/architecture.md``, "The offset store".
    """

    conn_name_attr = "offset_store_conn_id"
    default_conn_name = DEFAULT_OFFSET_STORE_CONN_ID
    hook_name = "airflow_eo offset store"

    def __init__(self, offset_store_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.offset_store_conn_id = offset_store_conn_id

    def get_store(self) -> ManagedOffsetStore:
        """The offset store of the connection's type."""
        return store_for(AirflowConnectionResolver().connection(self.offset_store_conn_id))

    @cached_property
    def reader(self) -> ManagedOffsetStore:
        """One store for repeated reads (a trigger's looks): its schema is checked and migrated once, not at every
        read. A read on a kept connection asks first whether it still answers, so a store that restarted in between is
        read again on a new one."""
        return self.get_store()

    def committed_offsets(self, pipeline_id: str) -> dict[tuple[str, int], int]:
        """The next offset to process per ``(topic, partition)``, as the pipeline's committed batches left it.

        :param pipeline_id: the pipeline.
        """
        return self.get_store().committed_offsets(pipeline_id)

    def pending_offsets(self, pipeline_id: str) -> tuple[dict[tuple[str, int], int], list[OffsetRange]]:
        """The pipeline's committed offsets, and the ranges of its unfinished (planned or prepared) batches, read
        before the offsets: a batch committing in between is then seen in one or the other
        (:func:`~airflow_eo.core.backlog_events.planned_positions`). Reads only (the schema is migrated first, as
        :meth:`committed_offsets` does, once per hook: :attr:`reader`).

        :param pipeline_id: the pipeline.
        """
        planned = [r for batch in self.reader.unfinished_batches(pipeline_id) for r in batch.ranges]
        return self.reader.committed_offsets(pipeline_id), planned

    def committed_batch_id(self, pipeline_id: str, after_batch_id: int = -1,
                           interval: list[str] | None = None) -> int | None:
        """The id of a committed batch newer than ``after_batch_id`` or, with ``interval``, of that
        interval's batch once committed; None while there is none.

        :param pipeline_id: the pipeline.
        :param after_batch_id: only a committed batch id greater than this counts; -1 = any.
            Not used with ``interval``.
        :param interval: ISO-8601 start and end of an interval-mode batch (a run's data interval).
        """
        from datetime import datetime

        from airflow_eo.core.batch_states import BatchState
        from airflow_eo.core.planning import Interval

        store = self.get_store()
        if interval is not None:
            start, end = (datetime.fromisoformat(t) for t in interval)
            batch = store.batch_for_interval(pipeline_id, Interval(start, end))
            return batch.batch_id if batch is not None and batch.state == BatchState.COMMITTED else None
        latest = store.latest_committed_batch_id(pipeline_id)
        return latest if latest is not None and latest > after_batch_id else None
