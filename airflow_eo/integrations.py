"""Importing this module registers every built-in integration's kinds (sinks, offset stores): each folder
registers its own when imported (``airflow_eo/<integration>/__init__.py``). A new integration adds one import here.
"""

from __future__ import annotations

import airflow_eo.delta
import airflow_eo.iceberg
import airflow_eo.kafka
import airflow_eo.mysql
import airflow_eo.postgres  # noqa: F401
