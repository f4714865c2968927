"""The kafka integration: its sink kinds (and offset store) registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factories import the adapters when a run
builds one.
"""

from __future__ import annotations

from airflow_eo.core.drivers import Driver, register_driver
from airflow_eo.core.sinks import SinkCapabilities, register_sink
from airflow_eo.kafka.specs import KafkaTransactionalSink, build

# confluent-kafka is a required dependency (no extra): declared for its errors, which `airflow eo` reports in a line.
register_driver(Driver("kafka", "Kafka", "confluent_kafka", ("KafkaException",)))
register_sink(KafkaTransactionalSink, SinkCapabilities(accumulates=True, appends=True, consumer_group=True,
                                                       connection_type="kafka"), build)
