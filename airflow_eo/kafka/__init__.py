"""The kafka integration: its sink kinds (and offset store) registered once, here.

Cheap to import (a DAG file imports it through ``airflow_eo.sinks``): the factories import the adapters when a run
builds one.
"""

from __future__ import annotations

from airflow_eo.core.sinks import SinkCapabilities, register_sink
from airflow_eo.kafka.specs import KafkaTransactionalSink, build

register_sink(KafkaTransactionalSink, SinkCapabilities(accumulates=True, appends=True, consumer_group=True,
                                                       connection_type="kafka"), build)
