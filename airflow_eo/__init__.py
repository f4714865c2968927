"""airflow_eo: exactly-once Kafka → Spark → MySQL/Kafka micro-batches for Apache Airflow."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-eo",
        "name": "airflow_eo",
        "description": "Exactly-once batch-streaming from Kafka through Spark into MySQL or Kafka.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "airflow_eo", "external-doc-url": "https://pypi.org/project/airflow-eo/",
             "tags": ["software"]},
        ],
        "operators": [
            {"integration-name": "airflow_eo", "python-modules": ["airflow_eo.operators.micro_batch"]},
        ],
        "hooks": [
            {"integration-name": "airflow_eo",
             "python-modules": ["airflow_eo.hooks.mysql", "airflow_eo.hooks.kafka", "airflow_eo.hooks.spark"]},
        ],
        "sensors": [
            {"integration-name": "airflow_eo", "python-modules": ["airflow_eo.sensors.pipeline"]},
        ],
        "triggers": [
            {"integration-name": "airflow_eo", "python-modules": ["airflow_eo.triggers.pipeline"]},
        ],
        "connection-types": [],  # reuses kafka / mysql / spark connection types of their providers
        # `airflow eo ...` (Airflow >= 3.2 loads provider CLI commands from here)
        "cli": ["airflow_eo.cli.definition.get_eo_cli_commands"],
    }
