"""Kafka control plane for planning: partitions and offsets via confluent-kafka's AdminClient."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from airflow_eo.core.errors import ConfigurationError, UnavailableError
from airflow_eo.core.planning import Interval, IntervalOffsets, PartitionOffsets
from airflow_eo.kafka.timeouts import ADMIN_TIMEOUT_S, TRANSACTION_TIMEOUT_S, client_config

log = logging.getLogger(__name__)
T = TypeVar("T")
# What a broker that restarts or moves a partition's leadership answers for a while: asked again.
TRANSIENT = {KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION,
             KafkaError.LEADER_NOT_AVAILABLE, KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT,
             KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
             KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
             KafkaError._ALL_BROKERS_DOWN, KafkaError._WAIT_COORD}


def transient(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in TRANSIENT)


def retry_transient(what: str, call: Callable[[], T], timeout_s: float = ADMIN_TIMEOUT_S,
                    refresh: Callable[[], None] | None = None) -> T:
    """``call()``, asked again while the broker answers with a transient error, for up to ``timeout_s``;
    ``refresh()`` before each new try (a new client: an old one may keep asking with stale leader epochs).

    A broker that stays down fails with :class:`UnavailableError` (the next attempt retries); any other
    Kafka error (a missing topic, no permission) with :class:`ConfigurationError`, at once.
    """
    deadline, delay = time.monotonic() + timeout_s, 0.2
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not transient(exc):
                raise ConfigurationError(f"{what} failed: {exc}") from exc
            if time.monotonic() > deadline:
                raise UnavailableError(f"{what} failed for {timeout_s:.0f}s: {exc}; the broker is down or a "
                                       "partition has no leader. Nothing was read or committed; the next attempt "
                                       "retries") from exc
            log.info("%s: %s, asking again", what, exc)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            if refresh is not None:
                refresh()


def parse_starting_offsets(value: str | int) -> str | int:
    """``earliest`` | ``latest`` | a timestamp in epoch milliseconds."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    if value in ("earliest", "latest"):
        return value
    raise ConfigurationError(
        f"starting_offsets={value!r}: use 'earliest', 'latest' or a timestamp in epoch milliseconds"
    )


def group_id(pipeline_id: str) -> str:
    """The pipeline's Kafka consumer group: the Kafka sink commits its transactions' offsets there, and every other
    sink's committed offsets are mirrored there after each batch, for lag tools (never read back)."""
    return f"airflow_eo.{pipeline_id}"


def alter_group_offsets(admin: AdminClient, group: str, positions: Mapping[tuple[str, int], int]) -> None:
    """Set ``group``'s committed offsets to ``positions`` (per ``(topic, partition)``); a partition the broker refused
    raises its error."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in sorted(positions.items())])
    for future in admin.alter_consumer_group_offsets([request], request_timeout=ADMIN_TIMEOUT_S).values():
        for answered in future.result().topic_partitions or []:
            if answered.error is not None:  # the first partition's error, as the broker said it
                raise KafkaException(answered.error)


def read_group_offsets(admin: AdminClient, group: str, partitions: Iterable[tuple[str, int]],
                       who: str) -> dict[tuple[str, int], int]:
    """``group``'s committed offsets of ``partitions``, once no transaction's offsets are pending on them.

    Right after a Kafka sink's ``commit_transaction`` returns, the commit markers may still be on their way to the
    group's partitions: the broker answers such a partition with ``UNSTABLE_OFFSET_COMMIT`` (``require_stable``).
    That partition is asked again, never dropped: recovery would take a missing offset for an uncommitted batch.
    The partitions are named, not listed from the group: a listing shows only partitions with an offset already
    committed, so a group's first transaction would read as no offsets at all until its markers land.

    :param partitions: the ``(topic, partition)`` pairs to read; one without a committed offset is left out.
    :param who: who asks (named in the error when the offsets never become stable).
    """
    wanted = [TopicPartition(t, p) for t, p in sorted(set(partitions))]
    if not wanted:
        return {}
    request = [ConsumerGroupTopicPartitions(group, wanted)]
    deadline = time.monotonic() + TRANSACTION_TIMEOUT_S
    while True:
        futures = admin.list_consumer_group_offsets(request, require_stable=True, request_timeout=ADMIN_TIMEOUT_S)
        answered = next(iter(futures.values())).result().topic_partitions or []
        pending = [tp for tp in answered if tp.error is not None]
        if not pending:
            return {(tp.topic, tp.partition): tp.offset for tp in answered if tp.offset >= 0}
        if time.monotonic() > deadline:
            raise KafkaException(f"{who}: the committed offsets of group {group} on "
                                 + ", ".join(f"{tp.topic}[{tp.partition}] ({tp.error})" for tp in pending)
                                 + f" did not become stable in {TRANSACTION_TIMEOUT_S:.0f}s")
        time.sleep(0.2)


def described_topics(admin: Callable[[], AdminClient], topics: Sequence[str],
                     refresh: Callable[[], None] | None = None) -> dict[str, Any]:
    """Each of ``topics``' description (``describe_topics``: its partitions and their leaders), None for a topic that
    does not exist; asked again on a broker's transient errors (:func:`retry_transient`), each time of the client
    ``admin()`` gives then (``refresh`` may have made a new one).

    Only these topics' metadata, never the cluster's: that grew with the cluster's topics (a new client's first answer,
    1,040 topics on the stack's broker: 24-25 ms for all of them, 2.0 ms for one). librdkafka's request for a
    description never asks the broker to create a topic.
    """
    def look_up() -> dict[str, Any]:
        futures = admin().describe_topics(TopicCollection(list(dict.fromkeys(topics))),
                                          request_timeout=ADMIN_TIMEOUT_S)
        found: dict[str, Any] = {}
        for topic, future in futures.items():
            try:
                found[topic] = future.result()
            except KafkaException as exc:  # a topic without a leader (a broker restarting) is asked again
                error = exc.args[0] if exc.args else None
                if not (isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise
                found[topic] = None  # no such topic: the caller says so, in its words
        return found

    return retry_transient("Kafka metadata look-up", look_up, refresh=refresh)


#: one ListOffsets look-up: what to ask of each partition, and as which reader
OffsetLookup = tuple[dict[TopicPartition, OffsetSpec], IsolationLevel]


def _log_starts(tps: Sequence[TopicPartition]) -> OffsetLookup:
    return {tp: OffsetSpec.earliest() for tp in tps}, IsolationLevel.READ_COMMITTED


def _last_stable_offsets(tps: Sequence[TopicPartition]) -> OffsetLookup:
    return {tp: OffsetSpec.latest() for tp in tps}, IsolationLevel.READ_COMMITTED


def _high_watermarks(tps: Sequence[TopicPartition]) -> OffsetLookup:
    return {tp: OffsetSpec.latest() for tp in tps}, IsolationLevel.READ_UNCOMMITTED


class KafkaOffsetSource:
    """Reads partition metadata and offsets; implements ``core.protocol.OffsetSource``.

    :param config: librdkafka configuration (the ``extra`` of an Airflow ``kafka`` connection).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        if "bootstrap.servers" not in config:
            raise ConfigurationError("the Kafka connection has no 'bootstrap.servers' in its extra")
        self.config = client_config(config)  # a new dict: the caller's stays as it is
        self._admin = AdminClient(self.config)

    def _new_client(self) -> None:
        self._admin = AdminClient(self.config)

    def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        """The partitions of ``topics``, from the broker's metadata of those topics only (:func:`described_topics`)."""
        described = described_topics(lambda: self._admin, topics, refresh=self._new_client)
        found: list[TopicPartition] = []
        for topic in topics:
            description = described.get(topic)
            if description is None:
                raise ConfigurationError(
                    f"Kafka topic {topic!r} does not exist on {self.config['bootstrap.servers']}: "
                    "create it or fix the pipeline's topics"
                )
            found.extend(TopicPartition(topic, p) for p in sorted(info.id for info in description.partitions))
        return found

    def _list_offsets_together(self, lookups: Sequence[OffsetLookup]) -> list[dict[tuple[str, int], int]]:
        """Each ``(specs, isolation level)`` look-up's offsets, their requests in flight together: a batch waits on
        the broker once for all of them (under load, each wait is what grows)."""
        if not any(specs for specs, _ in lookups):
            return [{} for _ in lookups]

        def look_up() -> list[dict[tuple[str, int], int]]:
            sent = [self._admin.list_offsets(specs, isolation_level=level, request_timeout=ADMIN_TIMEOUT_S)
                    if specs else {} for specs, level in lookups]
            return [{(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()} for futures in sent]

        return retry_transient("Kafka offsets look-up", look_up, refresh=self._new_client)

    def earliest(self, tps: Sequence[TopicPartition]) -> dict[tuple[str, int], int]:
        return self._list_offsets_together([_log_starts(tps)])[0]

    def last_stable(self, tps: Sequence[TopicPartition]) -> dict[tuple[str, int], int]:
        """End offsets for read_committed readers: records of open transactions are excluded."""
        return self._list_offsets_together([_last_stable_offsets(tps)])[0]

    def high_watermarks(self, tps: Sequence[TopicPartition]) -> dict[tuple[str, int], int]:
        """End offsets including records of open transactions."""
        return self._list_offsets_together([_high_watermarks(tps)])[0]

    def uses_log_append_time(self, topics: Sequence[str]) -> dict[str, bool]:
        """Whether each topic's records carry the broker's append time (``message.timestamp.type``)."""
        def look_up() -> dict[str, bool]:
            futures = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in set(topics)],
                                                   request_timeout=ADMIN_TIMEOUT_S)
            return {resource.name: future.result()["message.timestamp.type"].value == "LogAppendTime"
                    for resource, future in futures.items()}

        return retry_transient("Kafka topic configuration look-up", look_up, refresh=self._new_client)

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[tuple[str, int], int]:
        """First offset whose timestamp is >= ``timestamp_ms``; the end offset when there is none."""
        found = self._offsets_at(tps, timestamp_ms)
        ends = self.last_stable(tps)
        return {k: (v if v is not None else ends[k]) for k, v in found.items()}

    def _offsets_at(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[tuple[str, int], int | None]:
        """``offsets_for_times``: first offset whose timestamp is >= ``timestamp_ms``, None when there is none."""
        found = self._list_offsets_together([({tp: OffsetSpec.for_timestamp(timestamp_ms) for tp in tps},
                                               IsolationLevel.READ_COMMITTED)])[0]
        return {k: (v if v >= 0 else None) for k, v in found.items()}

    def interval_offsets(self, topics: Sequence[str], interval: Interval) -> list[IntervalOffsets]:
        tps = self.partitions(topics)
        append_time = self.uses_log_append_time(topics)
        # The ends first: a record appended after them is newer than the timestamp look-ups below. The three go out
        # together, so either end may be read first: the idle close (planning.py) holds either way, since a record
        # beyond the high watermark it compares was appended after that read.
        log_start, stable, high = self._list_offsets_together([_log_starts(tps), _last_stable_offsets(tps),
                                                               _high_watermarks(tps)])
        starts, ends = self._offsets_at(tps, interval.start_ms), self._offsets_at(tps, interval.end_ms)
        return [IntervalOffsets(tp.topic, tp.partition, log_start[k], stable[k], starts[k], ends[k],
                                high_watermark=high[k], log_append_time=append_time[tp.topic])
                for tp in tps for k in [(tp.topic, tp.partition)]]

    def mirror_group_offsets(self, pipeline_id: str, positions: Mapping[tuple[str, int], int]) -> None:
        """Commit ``positions`` (the store's committed offsets) to the pipeline's group :func:`group_id`, for lag tools
        only. Every partition is committed each time, moved or not: a group without members keeps an offset for
        ``offsets.retention.minutes`` after its last commit (7 days by default), so each run renews them all.

        :param pipeline_id: the pipeline.
        :param positions: the next offset to read per ``(topic, partition)``.
        """
        if not positions:
            return
        retry_transient(f"committing the offsets of group {group_id(pipeline_id)}",
                        lambda: alter_group_offsets(self._admin, group_id(pipeline_id), positions),
                        refresh=self._new_client)

    def delete_group(self, pipeline_id: str) -> bool:
        """Delete the pipeline's group :func:`group_id` (``airflow eo retire``, ``rename``); False when the broker has
        no such group. A group with members (a consumer someone runs under our name) is refused by the broker."""
        group = group_id(pipeline_id)

        def delete() -> bool:
            try:
                for future in self._admin.delete_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S).values():
                    future.result()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_ID_NOT_FOUND:
                    return False
                raise
            return True

        return retry_transient(f"deleting group {group}", delete, refresh=self._new_client)

    def first_timestamps(self, positions: Mapping[tuple[str, int], int],
                         timeout_s: float = ADMIN_TIMEOUT_S) -> dict[tuple[str, int], int]:
        """The timestamp (ms) of the first committed record at or after each position, read with a
        read_committed consumer assigned there (no group joined, nothing committed). A partition with no such
        record within ``timeout_s`` (only aborted records or markers left) is absent."""
        if not positions:
            return {}
        consumer = Consumer({**self.config, "group.id": "airflow_eo.lag-probe", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
            pending, found = set(positions), {}
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                key = (message.topic(), message.partition())
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF and not error.retriable():
                    raise KafkaException(error)
                if key in pending and (error is None or error.code() == KafkaError._PARTITION_EOF):
                    pending.discard(key)
                    if error is None:
                        found[key] = message.timestamp()[1]
                    consumer.pause([TopicPartition(*key)])
            return found
        finally:
            consumer.close()

    def group_offsets(self, pipeline_id: str, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The committed offsets of the pipeline's group :func:`group_id` on ``partitions`` (``airflow eo verify``
        compares them with the store's); a partition without one is left out.

        :param pipeline_id: the pipeline.
        :param partitions: the ``(topic, partition)`` pairs to read.
        """
        keys = list(partitions)
        return retry_transient(f"reading the offsets of group {group_id(pipeline_id)}",
                               lambda: read_group_offsets(self._admin, group_id(pipeline_id), keys, "verify"),
                               refresh=self._new_client)

    def partition_offsets(self, topics: Sequence[str], starting_offsets: str | int) -> list[PartitionOffsets]:
        tps = self.partitions(topics)
        start_policy = parse_starting_offsets(starting_offsets)
        log_start, stable = self._list_offsets_together([_log_starts(tps), _last_stable_offsets(tps)])
        if start_policy == "earliest":
            initial = log_start
        elif start_policy == "latest":
            initial = stable
        else:
            initial = self.offsets_for_time(tps, int(start_policy))
        return [
            PartitionOffsets(tp.topic, tp.partition, log_start[(tp.topic, tp.partition)],
                             stable[(tp.topic, tp.partition)], initial[(tp.topic, tp.partition)])
            for tp in tps
        ]
