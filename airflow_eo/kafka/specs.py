"""The transactional Kafka sink kind a DAG declares (validated at parse time, no I/O) and its registration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eo.core.config import TombstonePolicy, tombstone_policy
from airflow_eo.core.connections import Connections
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_identifier, validate_topic
from airflow_eo.core.sink_kinds import SinkAsset, SinkSpec

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink


@dataclass(frozen=True)
class KafkaTransactionalSink(SinkSpec):
    """Append the output to a Kafka topic inside one Kafka transaction that also commits the offsets.

    The producer's ``transactional.id`` is stable per pipeline (``airflow_eo.<pipeline_id>``),
    so a newer attempt fences any older one; the consumed offsets go into the same
    transaction for the consumer group ``airflow_eo.<pipeline_id>``. Consumers of the output
    read with ``isolation.level=read_committed``. The transform's output needs the columns
    ``key_column`` and ``value_column`` (string or binary).

    :param topic: output topic (must exist).
    :param conn_id: Airflow ``kafka`` connection of the output cluster.
    :param transaction_timeout_ms: longest a batch's transaction may stay open; must not exceed
        the broker's ``transaction.max.timeout.ms`` (checked before any side effect).
    :param on_tombstone: ``"bad_record"`` only: a tombstone is a bad record (refused: ``"delete"``).
    """

    topic: str
    conn_id: str = "kafka_default"
    key_column: str = "key"
    value_column: str = "value"
    transaction_timeout_ms: int = 600_000
    on_tombstone: TombstonePolicy | str = TombstonePolicy.BAD_RECORD

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_tombstone", tombstone_policy(
            "KafkaTransactionalSink", self.on_tombstone, self.capabilities.deletes,
            "the Kafka sink appends the transform's records to its topic; it has no row a tombstone could delete"))
        if not self.topic or not isinstance(self.topic, str):
            raise ConfigurationError("KafkaTransactionalSink: topic must name the output topic")
        validate_topic(self.topic, "KafkaTransactionalSink: output topic")
        for column in (self.key_column, self.value_column):
            validate_identifier(column, "column name")
        if not 1_000 <= self.transaction_timeout_ms <= 3_600_000:
            raise ConfigurationError("KafkaTransactionalSink: transaction_timeout_ms must be 1000..3600000")

    @property
    def target(self) -> str:
        return self.topic

    def asset(self, connections: Connections) -> SinkAsset:
        """``kafka://bootstrap/topic``, the scheme of Airflow's Kafka provider."""
        bootstrap = str(connections.kafka_config(self.conn_id).get("bootstrap.servers", ""))
        return SinkAsset(f"kafka://{bootstrap.split(',')[0]}", self.topic)


def build(spec: KafkaTransactionalSink, pipeline_id: str, connections: Connections,
           offset_store_conn_id: str | None) -> Sink:
    # init_transactions fences an older attempt's producer: no store epoch needed.
    from airflow_eo.kafka.sink import KafkaTransactionalAdapter

    return KafkaTransactionalAdapter(connections.kafka_config(spec.conn_id), pipeline_id, name=spec.name,
                                     topic=spec.topic, key_column=spec.key_column, value_column=spec.value_column,
                                     transaction_timeout_ms=spec.transaction_timeout_ms)
