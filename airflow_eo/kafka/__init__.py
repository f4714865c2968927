"""The kafka integration: its sink kinds (and offset store) registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factories import the adapters when a run
builds one.
"""

from __future__ import annotations

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.drivers import Driver, register_driver
from airflow_eo.core.sink_kinds import register_sink
from airflow_eo.kafka.specs import KafkaTransactionalSink, build

# confluent-kafka is a required dependency (no extra): declared for its errors, which `airflow eo` reports in a line.
register_driver(Driver("kafka", "Kafka", "confluent_kafka", ("KafkaException",)))
# Its transaction (offsets included) is the commit point; read_committed readers see nothing before it, and its
# tasks write into it apart from the commit.
register_sink(KafkaTransactionalSink, SinkCapabilities(owns_commit_point=True, accumulates=True, appends=True,
                                                       consumer_group=True, connection_type="kafka"), build)
