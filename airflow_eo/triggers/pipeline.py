"""Deferrable waits on a pipeline: Kafka backlog, committed batches. No side effects.

Each trigger holds the hooks that own the queries and polls them; the hooks' methods are
blocking, so they run in a thread (``asyncio.to_thread``) off the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_eo import DEFAULT_OFFSET_STORE_CONN_ID
from airflow_eo.core.backlog import BacklogThreshold, oldest_age_seconds
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.offset_store import OffsetStoreHook


def backlog_seen(kafka_hook: KafkaClusterHook, threshold: BacklogThreshold, topics: Sequence[str],
                 committed: Mapping[tuple[str, int], int],
                 starting_offsets: str | int) -> tuple[dict[str, int], float | None]:
    """One look (blocking): the lag per partition, and the oldest unprocessed record's age when the threshold
    watches it (Kafka is read for it only then)."""
    if not threshold.needs_age:
        return kafka_hook.backlog(topics, committed, starting_offsets), None
    lag, first = kafka_hook.backlog_and_first_timestamps(topics, committed, starting_offsets)
    return lag, oldest_age_seconds(first, int(time.time() * 1000))


class KafkaBacklogTrigger(BaseTrigger):
    """Fires when the pipeline's unprocessed records reach ``min_records``, or its oldest unprocessed record is
    ``min_age_seconds`` old, whichever comes first.

    :param pipeline_id: pipeline whose committed offsets count as processed.
    :param topics: the pipeline's topics.
    :param min_records: records to wait for (in total, or in one partition with ``per_partition``); None = only
        the age counts.
    :param per_partition: compare ``min_records`` with each partition's lag instead of the sum.
    :param starting_offsets: where a partition without a committed offset starts (as the operator's).
    :param kafka_conn_id: the ``kafka`` connection of the topics.
    :param offset_store_conn_id: the ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store.
    :param poll_interval: seconds between two looks.
    :param min_age_seconds: fire when the oldest unprocessed record (by its Kafka timestamp) is this old.
    """

    def __init__(self, pipeline_id: str, topics: Sequence[str], min_records: int | None = 1,
                 per_partition: bool = False, starting_offsets: str | int = "earliest",
                 kafka_conn_id: str = "kafka_default", offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID,
                 poll_interval: float = 10.0, min_age_seconds: float | None = None) -> None:
        super().__init__()
        self.threshold = BacklogThreshold(min_records, per_partition, min_age_seconds)
        self.min_age_seconds = min_age_seconds
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
            "poll_interval": self.poll_interval, "min_age_seconds": self.min_age_seconds,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            committed = await asyncio.to_thread(self.store_hook.committed_offsets, self.pipeline_id)
            lag, age = await asyncio.to_thread(backlog_seen, self.kafka_hook, self.threshold, self.topics, committed,
                                               self.starting_offsets)
            if self.threshold.reached(lag, age):
                yield TriggerEvent({"status": "ready", **self.threshold.report(lag, age)})
                return
            self.log.info("pipeline %s: %d unprocessed records, waiting for %s", self.pipeline_id,
                          sum(lag.values()), self.threshold.describe())
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
