"""Kafka control plane for planning: partitions and offsets via confluent-kafka's AdminClient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.planning import Interval, IntervalOffsets, PartitionOffsets

TIMEOUT_S = 30.0


def parse_starting_offsets(value: str | int) -> str | int:
    """``earliest`` | ``latest`` | a timestamp in epoch milliseconds."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    if value in ("earliest", "latest"):
        return value
    raise ConfigurationError(
        f"starting_offsets={value!r}: use 'earliest', 'latest' or a timestamp in epoch milliseconds"
    )


class KafkaOffsetSource:
    """Reads partition metadata and offsets; implements ``core.protocol.OffsetSource``.

    :param config: librdkafka configuration (the ``extra`` of an Airflow ``kafka`` connection).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        if "bootstrap.servers" not in config:
            raise ConfigurationError("the Kafka connection has no 'bootstrap.servers' in its extra")
        self.config = dict(config)
        self._admin = AdminClient(self.config)

    def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        metadata = self._admin.list_topics(timeout=TIMEOUT_S)
        found: list[TopicPartition] = []
        for topic in topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                raise ConfigurationError(
                    f"Kafka topic {topic!r} does not exist on {self.config['bootstrap.servers']}: "
                    "create it or fix the pipeline's topics"
                )
            found.extend(TopicPartition(topic, p) for p in sorted(info.partitions))
        return found

    def _list_offsets(self, specs: dict[TopicPartition, OffsetSpec],
                      isolation_level: IsolationLevel = IsolationLevel.READ_COMMITTED) -> dict[tuple[str, int], int]:
        if not specs:
            return {}
        futures = self._admin.list_offsets(specs, isolation_level=isolation_level, request_timeout=TIMEOUT_S)
        try:
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
        except KafkaException as exc:
            raise ConfigurationError(f"Kafka offsets look-up failed: {exc}") from exc

    def earliest(self, tps: Sequence[TopicPartition]) -> dict[tuple[str, int], int]:
        return self._list_offsets({tp: OffsetSpec.earliest() for tp in tps})

    def last_stable(self, tps: Sequence[TopicPartition]) -> dict[tuple[str, int], int]:
        """End offsets for read_committed readers: records of open transactions are excluded."""
        return self._list_offsets({tp: OffsetSpec.latest() for tp in tps})

    def high_watermarks(self, tps: Sequence[TopicPartition]) -> dict[tuple[str, int], int]:
        """End offsets including records of open transactions."""
        return self._list_offsets({tp: OffsetSpec.latest() for tp in tps}, IsolationLevel.READ_UNCOMMITTED)

    def uses_log_append_time(self, topics: Sequence[str]) -> dict[str, bool]:
        """Whether each topic's records carry the broker's append time (``message.timestamp.type``)."""
        futures = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in set(topics)],
                                               request_timeout=TIMEOUT_S)
        try:
            return {resource.name: future.result()["message.timestamp.type"].value == "LogAppendTime"
                    for resource, future in futures.items()}
        except KafkaException as exc:
            raise ConfigurationError(f"Kafka topic configuration look-up failed: {exc}") from exc

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[tuple[str, int], int]:
        """First offset whose timestamp is >= ``timestamp_ms``; the end offset when there is none."""
        found = self._offsets_at(tps, timestamp_ms)
        ends = self.last_stable(tps)
        return {k: (v if v is not None else ends[k]) for k, v in found.items()}

    def _offsets_at(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[tuple[str, int], int | None]:
        """``offsets_for_times``: first offset whose timestamp is >= ``timestamp_ms``, None when there is none."""
        found = self._list_offsets({tp: OffsetSpec.for_timestamp(timestamp_ms) for tp in tps})
        return {k: (v if v >= 0 else None) for k, v in found.items()}

    def interval_offsets(self, topics: Sequence[str], interval: Interval) -> list[IntervalOffsets]:
        tps = self.partitions(topics)
        append_time = self.uses_log_append_time(topics)
        # The ends first: a record appended after them is newer than the timestamp look-ups below.
        log_start, stable, high = self.earliest(tps), self.last_stable(tps), self.high_watermarks(tps)
        starts, ends = self._offsets_at(tps, interval.start_ms), self._offsets_at(tps, interval.end_ms)
        return [IntervalOffsets(tp.topic, tp.partition, log_start[k], stable[k], starts[k], ends[k],
                                high_watermark=high[k], log_append_time=append_time[tp.topic])
                for tp in tps for k in [(tp.topic, tp.partition)]]

    def partition_offsets(self, topics: Sequence[str], starting_offsets: str | int) -> list[PartitionOffsets]:
        tps = self.partitions(topics)
        start_policy = parse_starting_offsets(starting_offsets)
        log_start = self.earliest(tps)
        stable = self.last_stable(tps)
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
