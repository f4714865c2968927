"""Transactional Kafka sink (``docs/architecture.md``, "Sinks"): the Kafka transaction is the commit point.

One transactional producer per pipeline (``transactional.id`` stable per pipeline, so
``init_transactions`` fences any older producer of the same pipeline) produces the
batch's output and sends the batch's end offsets into the same transaction for the
pipeline's consumer group. ``commit_transaction`` makes output and offsets visible
together to ``read_committed`` consumers; the offset store mirrors it afterwards.
Recovery compares the store with the group's committed offsets: a batch whose end the
group already reached was committed by Kafka and is rolled forward in the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from airflow_eo.core.abilities import no_dead_letters
from airflow_eo.core.batch import BatchContext, BatchRecord, DeadLetter, WritePlan, WriteResult
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.recovery import SinkRecovery, committed_by_kafka
from airflow_eo.core.sink_kinds import KindAdapter
from airflow_eo.kafka.offsets import (
    KafkaOffsetSource,
    alter_group_offsets,
    described_topics,
    group_id,
    read_group_offsets,
)
from airflow_eo.kafka.timeouts import ADMIN_TIMEOUT_S, TRANSACTION_TIMEOUT_S, client_config

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: librdkafka settings of the connection that a producer/consumer must not inherit.
_NOT_FOR_CLIENTS = ("group.id", "transactional.id", "enable.auto.commit", "auto.offset.reset", "isolation.level")


def transactional_id(pipeline_id: str) -> str:
    return f"airflow_eo.{pipeline_id}"


class KafkaTransactionalAdapter(KindAdapter):
    """The run-time side of :class:`~airflow_eo.kafka.specs.KafkaTransactionalSink` (a ``core.protocol.Sink``).

    :param config: librdkafka config of the target cluster's Airflow ``kafka`` connection.
    :param pipeline_id: the pipeline whose producer and consumer group this is.
    :param name: the sink kind's name, for messages.
    :param topic: the output topic.
    :param key_column: the output's column written as the record key.
    :param value_column: the output's column written as the record value.
    :param transaction_timeout_ms: longest a batch's transaction may stay open.
    """

    def __init__(self, config: Mapping[str, Any], pipeline_id: str, *, name: str, topic: str, key_column: str,
                 value_column: str, transaction_timeout_ms: int) -> None:
        self.name = name
        self.config = client_config({k: v for k, v in config.items() if k not in _NOT_FOR_CLIENTS})
        self.topic, self.pipeline_id = topic, pipeline_id
        self.key_column, self.value_column = key_column, value_column
        self.transaction_timeout_ms = transaction_timeout_ms
        self._producer: Producer | None = None
        self._in_txn = False
        self._admin = AdminClient(self.config)

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        description = described_topics(lambda: self._admin, [self.topic]).get(self.topic)
        if description is None:
            raise ConfigurationError(f"{self.name}: output topic {self.topic!r} does not exist: create it first")
        leader = next((info.leader for info in description.partitions if info.leader is not None), None)
        broker_max = self.broker_max_transaction_timeout_ms(leader.id if leader is not None else self._any_broker())
        if broker_max is not None and self.transaction_timeout_ms > broker_max:
            raise ConfigurationError(
                f"{self.name}: transaction_timeout_ms={self.transaction_timeout_ms} exceeds the broker's "
                f"transaction.max.timeout.ms={broker_max}; lower it (a batch must produce and commit within it, "
                "so also lower max_records_per_run) or raise the broker setting"
            )

    def _any_broker(self) -> int | None:
        """A broker of the cluster (the output topic's partitions have no leader now); None if none answers."""
        try:
            nodes = self._admin.describe_cluster(request_timeout=ADMIN_TIMEOUT_S).result(timeout=ADMIN_TIMEOUT_S).nodes
        except (KafkaException, TimeoutError):
            return None
        return nodes[0].id if nodes else None

    def broker_max_transaction_timeout_ms(self, broker_id: int | None) -> int | None:
        """The broker's ``transaction.max.timeout.ms`` (None: no broker, or not allowed to describe its configuration:
        the producer then reports a mismatch itself)."""
        if broker_id is None:
            return None
        resource = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
        try:
            configs = self._admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
        except (KafkaException, TimeoutError):
            return None  # not allowed to describe broker configs, or no answer: the producer will report a mismatch
        entry = configs.get("transaction.max.timeout.ms")
        return int(entry.value) if entry is not None and entry.value is not None else None

    # ------------------------------------------------------------------ producer

    def producer(self) -> Producer:
        """This attempt's producer; ``init_transactions`` fences older producers of the pipeline."""
        if self._producer is None:
            producer = Producer({
                **self.config,
                "transactional.id": transactional_id(self.pipeline_id),
                "transaction.timeout.ms": self.transaction_timeout_ms,
                "enable.idempotence": True,
                "linger.ms": 20,
                "queue.buffering.max.messages": 500_000,
                # Whatever the connection's extra says: a topic deleted since check() is an error, not a new topic.
                "allow.auto.create.topics": False,
            })
            # A broker connection first (the metadata request waits for one, as long as init_transactions would):
            # librdkafka asks for the transaction coordinator at once, and with no broker up yet asks again only
            # after 500 ms, at most starts (init 506 ms against 4-14 ms after the metadata, measured on the stack's
            # broker). The output topic's metadata only: the cluster's grows with its topics (24-25 ms with 1,040).
            producer.list_topics(self.topic, timeout=TRANSACTION_TIMEOUT_S)
            producer.init_transactions(TRANSACTION_TIMEOUT_S)
            self._producer = producer
        return self._producer

    def group_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offsets of ``partitions``, once no transaction's offsets are pending on them
        (:func:`~airflow_eo.kafka.offsets.read_group_offsets`); one without a committed offset is left out."""
        return read_group_offsets(self._admin, group_id(self.pipeline_id), partitions, self.name)

    def open_transactions(self) -> dict[tuple[str, int], tuple[int, int]]:
        """The output topic's partitions where a transaction is open, with (last stable offset, end offset): a
        ``read_committed`` reader stops at the first until the transaction ends (``airflow eo verify``)."""
        source = KafkaOffsetSource(dict(self.config))
        partitions = source.partitions([self.topic])
        stable, ends = source.last_stable(partitions), source.high_watermarks(partitions)
        return {key: (stable[key], end) for key, end in ends.items() if stable.get(key, end) < end}

    def in_doubt_server(self) -> str:
        """The cluster, as ``airflow eo verify --all`` names it."""
        return f"Kafka {self.config.get('bootstrap.servers')}"

    def transactional_id(self) -> str:
        return transactional_id(self.pipeline_id)

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        """The unfinished batches Kafka committed (the group reached their ends) but the store did not."""
        return committed_by_kafka(unfinished, self.group_offsets(r.key for b in unfinished for r in b.ranges))

    # ------------------------------------------------------------------ protocol steps

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        """Fence older producers, then name the unfinished batches Kafka already committed."""
        self.producer()  # init_transactions: an older producer's open transaction is aborted now
        if not unfinished:
            return SinkRecovery()
        committed = self.committed_batches(unfinished)
        for batch_id in sorted(committed):
            log.warning("%s: Kafka committed batch %d but the store did not record it; rolling forward",
                        self.name, batch_id)
        return SinkRecovery(committed=frozenset(committed))

    def move_group_offsets(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Set the pipeline's consumer-group offsets (``airflow eo rewind``): recovery compares unfinished batches
        with them, so they must follow the store's committed offsets when those are moved by hand.

        :param positions: the new offset per ``(topic, partition)``.
        """
        if not positions:
            return
        alter_group_offsets(self._admin, group_id(self.pipeline_id), positions)

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """Stream the output from Spark into one open transaction (two partitions in driver memory at most).

        The driver produces (one producer: one transaction); the job that computes the output counts the batch's
        records (:meth:`WritePlan.to_driver`).
        """
        out: DataFrame = plan.output
        missing = [c for c in (self.key_column, self.value_column) if c not in out.columns]
        if missing:
            raise ConfigurationError(f"{self.name}: the transform's output lacks column(s) {', '.join(missing)}; "
                                     f"it has {', '.join(out.columns)}")
        producer = self.producer()
        producer.begin_transaction()
        self._in_txn = True
        failpoint("before_produce")
        rows = 0
        started = time.monotonic()
        with plan.to_driver([self.key_column, self.value_column]) as stream:
            computed = time.monotonic()
            for key, value in _pairs(stream.batches):
                while True:
                    try:
                        producer.produce(self.topic, value=_bytes(value), key=_bytes(key))
                        break
                    except BufferError:
                        producer.poll(0.1)
                rows += 1
                if rows % 1000 == 0:
                    producer.poll(0)
                    failpoint("mid_produce")
        produced = time.monotonic()
        if producer.flush(TRANSACTION_TIMEOUT_S) != 0:
            raise KafkaException(f"{self.name}: not every output record was delivered within {TRANSACTION_TIMEOUT_S}s")
        log.info("%s: batch %d's output computed in %.1fs, its %d records produced in %.1fs and flushed in %.1fs",
                 self.name, batch.batch_id, computed - started, rows, produced - computed, time.monotonic() - produced)
        failpoint("after_last_send")
        return WriteResult([], rows, counted=stream.counted)

    def commit(self, batch: BatchRecord) -> None:
        """THE commit point of this sink: the batch's end offsets into the transaction, then commit it."""
        positions = [TopicPartition(r.topic, r.partition, r.until_offset) for r in batch.ranges if r.size > 0]
        if not positions and not self._in_txn:
            return  # nothing consumed, nothing produced
        producer = self.producer()
        if not self._in_txn:
            producer.begin_transaction()  # the engine did not run (nothing to read): offsets only
            self._in_txn = True
        consumer = Consumer({**self.config, "group.id": group_id(self.pipeline_id), "enable.auto.commit": False})
        try:
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), TRANSACTION_TIMEOUT_S)
        finally:
            consumer.close()
        started = time.monotonic()
        producer.commit_transaction(TRANSACTION_TIMEOUT_S)
        self._in_txn = False
        self.last_commit_seconds = time.monotonic() - started
        log.info("%s: Kafka transaction of batch %d committed in %.3fs", self.name, batch.batch_id,
                 self.last_commit_seconds)
        failpoint("after_kafka_commit")

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        return None

    def can_hold_writes(self, out: Any) -> bool:
        return False  # nothing to hold: its writes are invisible until the commit point

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        return no_dead_letters(self.name, records)

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        if self._producer is not None and self._in_txn:
            self._in_txn = False
            try:
                self._producer.abort_transaction(TRANSACTION_TIMEOUT_S)
            except KafkaException:
                pass  # fenced or timed out: the broker aborts it, nothing of ours becomes visible


def _pairs(batches: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """(key, value) of each row of Arrow batches of the two columns, a whole column at a time; text comes out as its
    UTF-8 bytes (Arrow's cast keeps the buffers: no str object is built and encoded again per record)."""
    import pyarrow as pa

    def as_bytes(column: Any) -> list[Any]:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
        return column.to_pylist()

    for batch in batches:
        yield from zip(as_bytes(batch.column(0)), as_bytes(batch.column(1)), strict=True)


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):  # a BINARY column's value; the producer takes only read-only bytes
        return bytes(value)
    return str(value).encode()

