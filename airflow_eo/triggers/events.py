"""Runs when data arrives: :class:`EoBacklogTrigger`, the trigger of an Airflow 3 ``AssetWatcher`` (DESIGN section
17; docs/how-to/event-driven-runs.md).

Every look reads the pipeline's unfinished batches and committed offsets from the store, then the broker's offsets
(and, with ``max_delay``, one record per partition behind, for its timestamp): reads only, nothing committed, no
consumer group joined. When to fire is decided in :mod:`airflow_eo.core.backlog_events`.

**One poll per pipeline**: watchers of the same pipeline, topics and connections (and poll interval) return the
same :meth:`EoBacklogTrigger.shared_stream_key`, so Airflow's triggerer (3.3+) runs one :meth:`open_shared_stream`
loop for all of them and hands each look to every watcher's :meth:`filter_shared_stream`, which applies its own
thresholds and remembers its own events. Without the triggerer's shared streams (Airflow 3.2), :meth:`run` chains
the same two for one watcher.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_eo import DEFAULT_OFFSET_STORE_CONN_ID
from airflow_eo.core.backlog_events import (
    BacklogLook,
    LookFailed,
    RunRule,
    WatchState,
    decide,
    planned_positions,
    retry_delay,
)
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_pipeline_id, validate_topic
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.offset_store import OffsetStoreHook

log = logging.getLogger(__name__)


def _seconds(value: timedelta | float | None, name: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds <= 0:
        raise ConfigurationError(f"{name} must be a positive duration (a timedelta or seconds)")
    return seconds


class EoBacklogTrigger(BaseEventTrigger):
    """Fires an asset event when a pipeline has records to process: its *unplanned* backlog (from where its
    unfinished batches end, or its committed offsets, to the last stable offset) reaches ``min_records``, or its
    oldest unplanned record is ``max_delay`` old. Then it holds until a batch commits past that backlog, or
    ``min_interval`` passes, so that a queued or running run is not stormed with events. A store or broker that
    does not answer is logged and asked again with backoff (the poll interval doubled, up to 60 s), never an event.

    Use it in an ``AssetWatcher`` of an ``Asset`` that the pipeline's DAG is scheduled on::

        schedule=[Asset("page_views_backlog", watchers=[AssetWatcher(
            name="page_views_backlog", trigger=EoBacklogTrigger("my_pipeline", ["page_views"]))])]

    The event's payload: ``reason`` (``backlog``, or ``no_commit_within_min_interval`` when it fires again for a
    backlog no batch committed within ``min_interval``), ``lag`` per ``"topic[partition]"``, ``total``,
    ``oldest_age_seconds`` (with ``max_delay``) and ``pipeline_id``.

    :param pipeline_id: the micro-batch operator's pipeline id (not templated: a watcher has no run).
    :param topics: its topics.
    :param min_records: unplanned records that call for a run (1: any); None = only ``max_delay`` counts.
    :param max_delay: fire when the oldest unplanned record (by its Kafka timestamp) is this old (a ``timedelta`` or
        seconds); None = only ``min_records`` counts.
    :param min_interval: how long one event holds when no batch commits past its backlog, before the backlog fires
        again (the run may have failed, or the event been lost); a ``timedelta`` or seconds.
    :param starting_offsets: where a partition without a committed offset starts (the operator's).
    :param kafka_conn_id: the ``kafka`` connection of the topics.
    :param offset_store_conn_id: the ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store.
    :param poll_interval: seconds between two looks.
    """

    def __init__(self, pipeline_id: str, topics: Sequence[str] | str, min_records: int | None = 1,
                 max_delay: timedelta | float | None = None, min_interval: timedelta | float = 300.0,
                 starting_offsets: str | int = "earliest", kafka_conn_id: str = "kafka_default",
                 offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID, poll_interval: float = 2.0) -> None:
        super().__init__()
        self.pipeline_id = validate_pipeline_id(pipeline_id)
        self.topics = [validate_topic(t) for t in ([topics] if isinstance(topics, str) else topics)]
        if not self.topics:
            raise ConfigurationError("topics must name at least one Kafka topic")
        self.rule = RunRule(min_records, _seconds(max_delay, "max_delay"),
                            _seconds(min_interval, "min_interval") or 0.0)
        self.starting_offsets = starting_offsets
        self.kafka_conn_id, self.offset_store_conn_id = kafka_conn_id, offset_store_conn_id
        self.poll_interval = _seconds(poll_interval, "poll_interval") or 0.0
        self.kafka_hook = KafkaClusterHook(kafka_conn_id)
        self.store_hook = OffsetStoreHook(offset_store_conn_id)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "pipeline_id": self.pipeline_id, "topics": self.topics, "min_records": self.rule.min_records,
            "max_delay": self.rule.max_delay_seconds, "min_interval": self.rule.min_interval_seconds,
            "starting_offsets": self.starting_offsets, "kafka_conn_id": self.kafka_conn_id,
            "offset_store_conn_id": self.offset_store_conn_id, "poll_interval": self.poll_interval,
        })

    def shared_stream_key(self) -> Hashable:
        """Watchers whose looks are the same share one poll: same pipeline, topics (in any order), starting offsets,
        connections and poll interval, and whether the first records' timestamps are read (``max_delay``). Their
        thresholds may differ: each watcher decides on the shared looks for itself."""
        return ("airflow_eo.backlog", self.pipeline_id, tuple(sorted(set(self.topics))), str(self.starting_offsets),
                self.kafka_conn_id, self.offset_store_conn_id, self.poll_interval, self.rule.needs_age)

    def look(self) -> BacklogLook:
        """One look at the backlog (blocking: run in a thread). The store first, then the broker: an offset
        committed before the broker's offsets were read is never beyond them."""
        committed, planned = self.store_hook.pending_offsets(self.pipeline_id)
        starts = planned_positions(committed, planned)
        total, unplanned = self.kafka_hook.backlogs(self.topics, [committed, starts], self.starting_offsets,
                                                    first_timestamps=self.rule.needs_age)
        return BacklogLook.of(time.monotonic(), committed, starts, total, unplanned, int(time.time() * 1000))

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[BacklogLook | LookFailed]:
        """Look every ``poll_interval`` seconds, for ever; a look that fails (the store or the broker does not
        answer, a topic is missing) is handed on as :class:`~airflow_eo.core.backlog_events.LookFailed` and tried
        again after a backoff. Uses only the fields of :meth:`shared_stream_key`."""
        poller = cls(**kwargs)
        # Once per shared stream: how many polls a triggerer runs for a pipeline's watchers (one, whatever their count).
        log.info("pipeline %s: looking at its backlog every %.0f s for its watchers", poller.pipeline_id,
                 poller.poll_interval)
        failures = 0
        while True:
            try:
                look = await asyncio.to_thread(poller.look)
            except Exception as error:  # never an event: logged by the watchers, asked again later
                failures += 1
                delay = retry_delay(poller.poll_interval, failures)
                log.debug("pipeline %s: no look at its backlog (%d failure(s) in a row), again in %.0f s: %s",
                          poller.pipeline_id, failures, delay, error)  # each watcher logs it as a warning
                yield LookFailed(f"{type(error).__name__}: {error}", failures, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            yield look
            await asyncio.sleep(poller.poll_interval)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This watcher's decision on every shared look (:func:`~airflow_eo.core.backlog_events.decide`)."""
        state, said = WatchState(since=time.monotonic()), ""
        async for look in shared_stream:
            if isinstance(look, LookFailed):
                self.log.warning("pipeline %s: the store or the broker did not answer (%s); no event, looking again "
                                 "in %.0f s", self.pipeline_id, look.error, look.retry_in)
                said = "failed"
                continue
            decision = decide(self.rule, look, state)
            state = decision.state
            kind = decision.reason.split(":", 1)[0]
            if decision.fire:
                self.log.info("pipeline %s: %s; %d records, firing", self.pipeline_id, decision.reason,
                              decision.payload["total"])
                yield TriggerEvent({"pipeline_id": self.pipeline_id, **decision.payload})
            elif kind != said:  # each change of what it waits for, not every look
                self.log.info("pipeline %s: %s", self.pipeline_id, decision.reason)
            said = kind

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """One watcher polling alone (a triggerer without shared streams, or a test): the same look and decision."""
        async for event in self.filter_shared_stream(type(self).open_shared_stream(self.serialize()[1])):
            yield event
