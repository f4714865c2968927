"""Sensors of airflow_eo."""

from airflow_eo.sensors.pipeline import BatchCommittedSensor, KafkaBacklogSensor

__all__ = ["BatchCommittedSensor", "KafkaBacklogSensor"]
