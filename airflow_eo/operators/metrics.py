"""The metrics a micro-batch emits through Airflow's ``Stats`` (StatsD / OpenTelemetry, as Airflow is configured).

Every metric is tagged ``pipeline_id`` (backends without tags drop them):

- ``airflow_eo.batch.records_in``, ``airflow_eo.batch.rows_out``, ``airflow_eo.batch.dead_letters``,
  ``airflow_eo.batch.duplicates`` (records dropped as copies of an event, ``dedup_key``): counters;
- ``airflow_eo.batch.committed``: a counter, +1 per batch committed or replayed;
- ``airflow_eo.lag``: a gauge, the offsets left to process right after the commit (continuous mode);
- ``airflow_eo.batch.seconds.<phase>``: timers per phase of the batch (``plan``, ``read_transform``,
  ``write``, ``dead_letters``, ``execute``, ``commit``, ``finalize``); a batch read, parsed and written in one
  Spark job has no ``read_transform``: its ``write`` holds all three.

- ``airflow_eo.group_mirror.failed``: a counter, +1 when a batch's offsets could not be mirrored into the
  consumer group ``airflow_eo.<pipeline_id>`` (the batch itself is committed; the next run moves the group).

- ``airflow_eo.in_doubt.oldest_age_seconds``: a gauge per database (tag ``database``), the age of its oldest
  in-doubt branch of ours, 0 with none; emitted by ``airflow eo verify --all`` (run it on a schedule to alert;
  ``airflow_eo/hooks/stats.py``).

A run that had already committed (a clear) did nothing and emits nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow_eo.core.batch import BatchSummary
from airflow_eo.hooks.stats import airflow_stats

__all__ = ["PREFIX", "airflow_stats", "emit_batch_metrics"]

PREFIX = "airflow_eo"


def emit_batch_metrics(summary: BatchSummary, lag: Mapping[str, int] | None, stats: Any = None) -> None:
    """Emit one attempt's batch metrics (see the module docstring).

    :param summary: what the attempt did (``run_batch``'s result).
    :param lag: offsets left per partition after the commit; None when unknown (interval mode, Kafka unreachable).
    :param stats: the ``Stats`` to emit to (default Airflow's).
    """
    stats = stats or airflow_stats()
    if stats is None or summary.already_committed:
        return
    tags = {"pipeline_id": summary.pipeline_id}
    stats.incr(f"{PREFIX}.batch.committed", 1, tags=tags)
    stats.incr(f"{PREFIX}.batch.records_in", summary.records_in, tags=tags)
    stats.incr(f"{PREFIX}.batch.rows_out", summary.rows_out, tags=tags)
    stats.incr(f"{PREFIX}.batch.dead_letters", summary.dead_letters, tags=tags)
    stats.incr(f"{PREFIX}.batch.duplicates", summary.duplicates, tags=tags)
    if lag is not None:
        stats.gauge(f"{PREFIX}.lag", sum(lag.values()), tags=tags)
    for phase, seconds in summary.seconds.items():
        # A phase name becomes part of the metric name: keep it to the characters StatsD allows.
        stats.timing(f"{PREFIX}.batch.seconds.{re.sub(r'[^A-Za-z0-9_]', '_', phase)}", timedelta(seconds=seconds),
                     tags=tags)


def emit_group_mirror_failure(pipeline_id: str, stats: Any = None) -> None:
    """Count a consumer-group mirror that failed (see the module docstring)."""
    stats = stats or airflow_stats()
    if stats is not None:
        stats.incr(f"{PREFIX}.group_mirror.failed", 1, tags={"pipeline_id": pipeline_id})
