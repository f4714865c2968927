"""Deferrable waits on a pipeline: Kafka backlog, committed batches. No side effects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


def measure_backlog(pipeline_id: str, topics: Sequence[str], starting_offsets: str | int, kafka_conn_id: str,
                    offset_store_conn_id: str) -> dict[str, int]:
    """Lag per partition from the broker's last stable offsets and the store's committed offsets (blocking)."""
    from airflow_eo.core.backlog import backlog
    from airflow_eo.hooks.kafka import KafkaClusterHook
    from airflow_eo.hooks.mysql import OffsetStoreHook

    partitions = KafkaClusterHook(kafka_conn_id).get_offset_source().partition_offsets(topics, starting_offsets)
    committed = OffsetStoreHook(offset_store_conn_id).get_store().committed_offsets(pipeline_id)
    return backlog(partitions, committed)


def committed_batch(pipeline_id: str, offset_store_conn_id: str, after_batch_id: int = -1,
                    interval: Sequence[str] | None = None) -> int | None:
    """The id of a committed batch newer than ``after_batch_id``, or of the interval's committed batch; else None."""
    from datetime import datetime

    from airflow_eo.core.planning import Interval
    from airflow_eo.core.states import BatchState
    from airflow_eo.hooks.mysql import OffsetStoreHook

    store = OffsetStoreHook(offset_store_conn_id).get_store()
    if interval is not None:
        batch = store.batch_for_interval(pipeline_id, Interval(*(datetime.fromisoformat(t) for t in interval)))
        return batch.batch_id if batch is not None and batch.state == BatchState.COMMITTED else None
    latest = store.latest_committed_batch_id(pipeline_id)
    return latest if latest is not None and latest > after_batch_id else None


class KafkaBacklogTrigger(BaseTrigger):
    """Fires when the pipeline's unprocessed records reach ``min_records``.

    :param pipeline_id: pipeline whose committed offsets count as processed.
    :param topics: the pipeline's topics.
    :param min_records: records to wait for (in total, or in one partition with ``per_partition``).
    :param per_partition: compare ``min_records`` with each partition's lag instead of the sum.
    :param poll_interval: seconds between two looks.
    """

    def __init__(self, pipeline_id: str, topics: Sequence[str], min_records: int = 1, per_partition: bool = False,
                 starting_offsets: str | int = "earliest", kafka_conn_id: str = "kafka_default",
                 offset_store_conn_id: str = "eo_offset_store", poll_interval: float = 10.0) -> None:
        super().__init__()
        self.pipeline_id, self.topics, self.min_records = pipeline_id, list(topics), min_records
        self.per_partition, self.starting_offsets = per_partition, starting_offsets
        self.kafka_conn_id, self.offset_store_conn_id = kafka_conn_id, offset_store_conn_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "pipeline_id": self.pipeline_id, "topics": self.topics, "min_records": self.min_records,
            "per_partition": self.per_partition, "starting_offsets": self.starting_offsets,
            "kafka_conn_id": self.kafka_conn_id, "offset_store_conn_id": self.offset_store_conn_id,
            "poll_interval": self.poll_interval,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_eo.core.backlog import backlog_reached

        while True:
            lag = await asyncio.to_thread(measure_backlog, self.pipeline_id, self.topics, self.starting_offsets,
                                          self.kafka_conn_id, self.offset_store_conn_id)
            if backlog_reached(lag, self.min_records, self.per_partition):
                yield TriggerEvent({"status": "ready", "lag": lag, "total": sum(lag.values())})
                return
            self.log.info("pipeline %s: %d unprocessed records, waiting for %d", self.pipeline_id,
                          sum(lag.values()), self.min_records)
            await asyncio.sleep(self.poll_interval)


class BatchCommittedTrigger(BaseTrigger):
    """Fires when the pipeline has committed a batch newer than ``after_batch_id`` (continuous mode),
    or the batch of ``interval`` (interval mode: ISO-8601 start and end)."""

    def __init__(self, pipeline_id: str, after_batch_id: int = -1, offset_store_conn_id: str = "eo_offset_store",
                 poll_interval: float = 10.0, interval: Sequence[str] | None = None) -> None:
        super().__init__()
        self.pipeline_id, self.after_batch_id = pipeline_id, after_batch_id
        self.offset_store_conn_id, self.poll_interval = offset_store_conn_id, poll_interval
        self.interval = list(interval) if interval is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "pipeline_id": self.pipeline_id, "after_batch_id": self.after_batch_id,
            "offset_store_conn_id": self.offset_store_conn_id, "poll_interval": self.poll_interval,
            "interval": self.interval,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            found = await asyncio.to_thread(committed_batch, self.pipeline_id, self.offset_store_conn_id,
                                            self.after_batch_id, self.interval)
            if found is not None:
                yield TriggerEvent({"status": "committed", "batch_id": found})
                return
            await asyncio.sleep(self.poll_interval)
