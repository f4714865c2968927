"""Deferrable waits on a pipeline: Kafka backlog, committed batches. No side effects.

Each trigger holds the hooks that own the queries and polls them; the hooks' methods are
blocking, so they run in a thread (``asyncio.to_thread``) off the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_eo import DEFAULT_OFFSET_STORE_CONN_ID
from airflow_eo.core.backlog import backlog_reached
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.offset_store import OffsetStoreHook


class KafkaBacklogTrigger(BaseTrigger):
    """Fires when the pipeline's unprocessed records reach ``min_records``.

    :param pipeline_id: pipeline whose committed offsets count as processed.
    :param topics: the pipeline's topics.
    :param min_records: records to wait for (in total, or in one partition with ``per_partition``).
    :param per_partition: compare ``min_records`` with each partition's lag instead of the sum.
    :param starting_offsets: where a partition without a committed offset starts (as the operator's).
    :param kafka_conn_id: the ``kafka`` connection of the topics.
    :param offset_store_conn_id: the ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store.
    :param poll_interval: seconds between two looks.
    """

    def __init__(self, pipeline_id: str, topics: Sequence[str], min_records: int = 1, per_partition: bool = False,
                 starting_offsets: str | int = "earliest", kafka_conn_id: str = "kafka_default",
                 offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID, poll_interval: float = 10.0) -> None:
        super().__init__()
        self.pipeline_id, self.topics, self.min_records = pipeline_id, list(topics), min_records
        self.per_partition, self.starting_offsets = per_partition, starting_offsets
        self.kafka_conn_id, self.offset_store_conn_id = kafka_conn_id, offset_store_conn_id
        self.poll_interval = poll_interval
        self.kafka_hook = KafkaClusterHook(kafka_conn_id)
        self.store_hook = OffsetStoreHook(offset_store_conn_id)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "pipeline_id": self.pipeline_id, "topics": self.topics, "min_records": self.min_records,
            "per_partition": self.per_partition, "starting_offsets": self.starting_offsets,
            "kafka_conn_id": self.kafka_conn_id, "offset_store_conn_id": self.offset_store_conn_id,
            "poll_interval": self.poll_interval,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            committed = await asyncio.to_thread(self.store_hook.committed_offsets, self.pipeline_id)
            lag = await asyncio.to_thread(self.kafka_hook.backlog, self.topics, committed, self.starting_offsets)
            if backlog_reached(lag, self.min_records, self.per_partition):
                yield TriggerEvent({"status": "ready", "lag": lag, "total": sum(lag.values())})
                return
            self.log.info("pipeline %s: %d unprocessed records, waiting for %d", self.pipeline_id,
                          sum(lag.values()), self.min_records)
            await asyncio.sleep(self.poll_interval)


class BatchCommittedTrigger(BaseTrigger):
    """Fires when the pipeline has committed a batch newer than ``after_batch_id`` (continuous mode),
    or the batch of ``interval`` (interval mode).

    :param pipeline_id: the pipeline to watch.
    :param after_batch_id: wait for a committed batch id greater than this; -1 = any.
    :param offset_store_conn_id: the ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store.
    :param poll_interval: seconds between two looks.
    :param interval: ISO-8601 start and end of the interval-mode batch to wait for; None = continuous mode.
    """

    def __init__(self, pipeline_id: str, after_batch_id: int = -1,
                 offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID,
                 poll_interval: float = 10.0, interval: Sequence[str] | None = None) -> None:
        super().__init__()
        self.pipeline_id, self.after_batch_id = pipeline_id, after_batch_id
        self.offset_store_conn_id, self.poll_interval = offset_store_conn_id, poll_interval
        self.interval = list(interval) if interval is not None else None
        self.hook = OffsetStoreHook(offset_store_conn_id)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "pipeline_id": self.pipeline_id, "after_batch_id": self.after_batch_id,
            "offset_store_conn_id": self.offset_store_conn_id, "poll_interval": self.poll_interval,
            "interval": self.interval,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            found = await asyncio.to_thread(self.hook.committed_batch_id, self.pipeline_id, self.after_batch_id,
                                            self.interval)
            if found is not None:
                yield TriggerEvent({"status": "committed", "batch_id": found})
                return
            await asyncio.sleep(self.poll_interval)
