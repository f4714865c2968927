"""Operators of airflow_eo."""

from airflow_eo.operators.micro_batch import KafkaMicroBatchOperator

__all__ = ["KafkaMicroBatchOperator"]
