"""airflow_eo: exactly-once Kafka → Spark → MySQL/MariaDB, PostgreSQL or Kafka micro-batches for Apache Airflow."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
CONFIG_SECTION = "eo"  # the provider's airflow.cfg section (``[eo]``, ``AIRFLOW__EO__...``)
#: The offset store\'s default Airflow connection id (the operator, sensors, triggers and `airflow eo`).
DEFAULT_OFFSET_STORE_CONN_ID = "eo_offset_store"


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow's providers manager (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-eo",
        "name": "airflow_eo",
        "description": "Exactly-once batch-streaming from Kafka through Spark into MySQL/MariaDB, PostgreSQL or "
                       "Kafka.",
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
             "python-modules": ["airflow_eo.hooks.offset_store", "airflow_eo.hooks.mysql", "airflow_eo.hooks.postgres",
                                "airflow_eo.hooks.kafka", "airflow_eo.hooks.spark"]},
        ],
        "sensors": [
            {"integration-name": "airflow_eo", "python-modules": ["airflow_eo.sensors.pipeline"]},
        ],
        "triggers": [
            {"integration-name": "airflow_eo",
             "python-modules": ["airflow_eo.triggers.pipeline", "airflow_eo.triggers.events"]},
        ],
        "connection-types": [],  # reuses kafka / mysql / postgres / spark connection types of their providers
        # `airflow eo ...` (Airflow >= 3.2 loads provider CLI commands from here)
        "cli": ["airflow_eo.cli.definition.get_eo_cli_commands"],
        # The "Exactly-once" tab on the DAG page (FastAPI app + external view, Airflow >= 3.1).
        "plugins": [{"name": "airflow_eo", "plugin-class": "airflow_eo.plugins.ExactlyOncePlugin"}],
        "config": {
            CONFIG_SECTION: {
                "description": "Where `airflow eo` and the Exactly-once tab find pipelines, and what the tab shows.",
                "options": {
                    "offset_store_conn_id": _option("mysql or postgres connection of the offset store (the default).",
                                                    DEFAULT_OFFSET_STORE_CONN_ID),
                    "kafka_conn_id": _option("kafka connection of the source cluster, for lag.", "kafka_default"),
                    "in_doubt_warning_seconds": _option(
                        "The tab highlights an in-doubt branch (XA, or a PostgreSQL prepared transaction) older than "
                        "this.", "300", "float"),
                    "ui_batch_limit": _option("Batches, audit rows and dead letters the tab shows per pipeline.",
                                              "20", "integer"),
                    "history_retention": _option(
                        "After each batch, history older than this goes (`airflow eo prune`'s rules, bounded per "
                        "batch): seconds or e.g. 90d, at least a day; empty: kept. An operator's history_retention "
                        "wins.", ""),
                    "ui_timeout_seconds": _option(
                        "The tab answers within this, saying so when the offset store or Kafka did not.", "30",
                        "float"),
                },
            },
        },
    }


def _option(description: str, default: str, kind: str = "string") -> dict[str, Any]:
    return {"description": description, "version_added": "0.1.0", "type": kind, "example": None, "default": default}
