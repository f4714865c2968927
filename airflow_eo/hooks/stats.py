"""Airflow's ``Stats`` (StatsD / OpenTelemetry), for the operators' metrics (``airflow_eo/operators/metrics.py``)
and the CLI's gauge of in-doubt work."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

PREFIX = "airflow_eo"


def airflow_stats() -> Any:
    """Airflow's ``Stats`` where this Airflow keeps it (the Task SDK's since 3.2; the core's before)."""
    for module in ("airflow.sdk.observability.stats", "airflow.observability.stats"):
        try:
            return importlib.import_module(module).Stats
        except ImportError:
            continue
    return None


def emit_in_doubt_gauges(oldest: Mapping[str, float], stats: Any = None) -> None:
    """``airflow_eo.in_doubt.oldest_age_seconds`` per database (``airflow eo verify --all``).

    :param oldest: database -> the age of its oldest in-doubt branch in seconds (0: none).
    :param stats: the ``Stats`` to emit to (default Airflow's).
    """
    stats = stats or airflow_stats()
    if stats is None:
        return
    for database, seconds in oldest.items():
        stats.gauge(f"{PREFIX}.in_doubt.oldest_age_seconds", seconds, tags={"database": database})
