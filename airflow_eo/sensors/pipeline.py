"""Sensors that wait on a pipeline: records to process (Kafka backlog), or a committed batch.

As in Airflow's providers: the hooks own the queries (:class:`~airflow_eo.hooks.kafka.KafkaClusterHook`,
:class:`~airflow_eo.hooks.offset_store.OffsetStoreHook`), ``poke`` calls them, and a deferrable sensor hands
the wait to a trigger that polls the same hook methods. ``deferrable`` defaults to
``[operators] default_deferrable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_eo import DEFAULT_OFFSET_STORE_CONN_ID
from airflow_eo.core.backlog import BacklogThreshold
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.triggers.pipeline import BatchCommittedTrigger, KafkaBacklogTrigger, backlog_seen

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger


class _DeferrableSensor(BaseSensorOperator):
    """Pokes once; if not done and ``deferrable``, hands the wait to :meth:`build_trigger` on the triggerer."""

    deferrable: bool

    def build_trigger(self, context: Context) -> BaseTrigger:
        """The trigger that waits in the triggerer, built from the operator's fields and ``context``."""
        raise NotImplementedError

    def poke(self, context: Context) -> PokeReturnValue:
        """One check: done or not, and the XCom value (:meth:`execute` reads both, not a bare bool)."""
        raise NotImplementedError

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)
        if first.is_done:
            return first.xcom_value
        self.defer(trigger=self.build_trigger(context), method_name="execute_complete",
                   timeout=timedelta(seconds=self.timeout) if self.timeout else None)


class KafkaBacklogSensor(_DeferrableSensor):
    """Wait until a pipeline has at least ``min_records`` unprocessed records, or (``min_age``) its oldest
    unprocessed record is that old, whichever comes first: a wait for work, or a lag alert.

    Unprocessed = last stable offset (read_committed end) minus the pipeline's committed
    offset, summed over partitions (or in any one partition with ``per_partition``). The age is the newest
    of now minus the Kafka timestamp of each partition's first unprocessed record. The
    XCom value is the lag seen: ``{"lag": {"topic[p]": n, ...}, "total": n}``, plus ``"oldest_age_seconds"``
    (None when nothing is unprocessed) with ``min_age``.

    :param pipeline_id: the micro-batch operator's pipeline id. (templated)
    :param topics: its topics. (templated)
    :param min_records: records to wait for; 1 = any new record; None = only ``min_age`` counts.
    :param min_age: done when the oldest unprocessed record is at least this old (a ``timedelta``).
    :param per_partition: compare per partition instead of the total.
    :param starting_offsets: where a partition without a committed offset starts (the operator's).
    :param kafka_conn_id: the ``kafka`` connection of the topics.
    :param offset_store_conn_id: the ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store.
    :param deferrable: hand the wait to the triggerer (frees the worker slot); defaults to
        ``[operators] default_deferrable``.
    :param poll_interval: seconds between looks when deferred (``poke_interval`` otherwise).
    """

    template_fields: Sequence[str] = ("pipeline_id", "topics")

    def __init__(self, *, pipeline_id: str, topics: Sequence[str] | str, min_records: int | None = 1,
                 min_age: timedelta | None = None, per_partition: bool = False,
                 starting_offsets: str | int = "earliest",
                 kafka_conn_id: str = "kafka_default", offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 poll_interval: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threshold = BacklogThreshold(min_records, per_partition,
                                          min_age.total_seconds() if min_age is not None else None)
        self.pipeline_id, self.topics = pipeline_id, [topics] if isinstance(topics, str) else list(topics)
        self.min_records, self.per_partition, self.starting_offsets = min_records, per_partition, starting_offsets
        self.kafka_conn_id, self.offset_store_conn_id = kafka_conn_id, offset_store_conn_id
        self.deferrable, self.poll_interval = deferrable, poll_interval

    @cached_property
    def kafka_hook(self) -> KafkaClusterHook:
        return KafkaClusterHook(self.kafka_conn_id)

    @cached_property
    def store_hook(self) -> OffsetStoreHook:
        return OffsetStoreHook(self.offset_store_conn_id)

    def poke(self, context: Context) -> PokeReturnValue:
        committed = self.store_hook.committed_offsets(self.pipeline_id)
        lag, age = backlog_seen(self.kafka_hook, self.threshold, self.topics, committed, self.starting_offsets)
        self.log.info("pipeline %s: %d unprocessed records (waiting for %s)", self.pipeline_id, sum(lag.values()),
                      self.threshold.describe())
        return PokeReturnValue(is_done=self.threshold.reached(lag, age), xcom_value=self.threshold.report(lag, age))

    def build_trigger(self, context: Context) -> KafkaBacklogTrigger:
        return KafkaBacklogTrigger(self.pipeline_id, self.topics, self.min_records, self.per_partition,
                                   self.starting_offsets, self.kafka_conn_id, self.offset_store_conn_id,
                                   self.poll_interval, self.threshold.min_age_seconds)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in event.items() if k != "status"}


class BatchCommittedSensor(_DeferrableSensor):
    """Wait until pipeline ``pipeline_id`` has committed a batch newer than ``after_batch_id``
    (continuous mode), or, with ``for_data_interval=True``, the batch of this run's data interval
    (an interval-mode pipeline on the same schedule). XCom: the committed batch id.

    :param pipeline_id: the pipeline to watch. (templated)
    :param after_batch_id: wait for a committed batch id greater than this; -1 = any. (templated)
    :param for_data_interval: wait for the interval-mode batch of this run's data interval.
    :param offset_store_conn_id: the ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store.
    :param deferrable: hand the wait to the triggerer; defaults to ``[operators] default_deferrable``.
    :param poll_interval: seconds between looks when deferred (``poke_interval`` otherwise).
    """

    template_fields: Sequence[str] = ("pipeline_id", "after_batch_id")

    def __init__(self, *, pipeline_id: str, after_batch_id: int | str = -1, for_data_interval: bool = False,
                 offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 poll_interval: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline_id, self.after_batch_id, self.for_data_interval = pipeline_id, after_batch_id, for_data_interval
        self.offset_store_conn_id, self.deferrable, self.poll_interval = offset_store_conn_id, deferrable, poll_interval

    @cached_property
    def hook(self) -> OffsetStoreHook:
        return OffsetStoreHook(self.offset_store_conn_id)

    def _resolve_interval(self, context: Context) -> list[str] | None:
        """This run's data interval as ISO-8601 start and end with ``for_data_interval``; else None."""
        if not self.for_data_interval:
            return None
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        if start is None or end is None:
            raise ConfigurationError("for_data_interval=True: this run has no data interval (manual or "
                                     "asset-triggered run); run it on a schedule or as a backfill")
        return [start.isoformat(), end.isoformat()]

    def poke(self, context: Context) -> PokeReturnValue:
        found = self.hook.committed_batch_id(self.pipeline_id, int(self.after_batch_id),
                                             self._resolve_interval(context))
        return PokeReturnValue(is_done=found is not None, xcom_value=found)

    def build_trigger(self, context: Context) -> BatchCommittedTrigger:
        return BatchCommittedTrigger(self.pipeline_id, int(self.after_batch_id), self.offset_store_conn_id,
                                     self.poll_interval, self._resolve_interval(context))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> int:
        return int(event["batch_id"])
