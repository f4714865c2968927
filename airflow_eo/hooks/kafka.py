"""Kafka connections (the ``kafka`` type of apache-airflow-providers-apache-kafka)."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

from airflow_eo.adapters.kafka_offsets import KafkaOffsetSource
from airflow_eo.adapters.kafka_sink import KafkaTransactionalAdapter
from airflow_eo.sinks import KafkaTransactionalSink


class KafkaClusterHook(KafkaBaseHook):
    """librdkafka config from a ``kafka`` connection's extra, and the offset look-ups built on it.

    :param kafka_config_id: the connection id (default ``kafka_default``).
    """

    def get_config(self) -> dict[str, Any]:
        build = getattr(self, "_build_config", None)  # resolves MSK IAM / allow-listed callbacks
        return dict(build() if build else self.get_connection(self.kafka_config_id).extra_dejson)

    def get_offset_source(self) -> KafkaOffsetSource:
        return KafkaOffsetSource(self.get_config())

    def get_sink_adapter(self, sink: KafkaTransactionalSink, pipeline_id: str) -> KafkaTransactionalAdapter:
        return KafkaTransactionalAdapter(self.get_config(), sink.topic, pipeline_id, sink.key_column,
                                         sink.value_column, sink.transaction_timeout_ms)
