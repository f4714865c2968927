"""Callbacks for Airflow's own alerts on a pipeline's DAG: what on-call needs to read when one fires.

``dags/page_view_events_hourly.py`` (the deadline) and ``dags/page_views_lag_alert.py`` (the lag alert) use them.

``pipeline_deadline_missed`` is an ``AsyncCallback`` for a ``DeadlineAlert`` (Airflow 3.1+): the triggerer runs
it when a run of the pipeline's DAG is not done in time, and it says where the pipeline stands (the last
committed batch, the lag, an unfinished batch, in-doubt branches) instead of only "late"::

    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

    DAG(..., deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(minutes=15),
        callback=AsyncCallback(pipeline_deadline_missed, kwargs={"pipeline_id": "page_views_xa"})))

``PipelineLagNotifier`` is a notifier for a ``KafkaBacklogSensor``'s ``on_success_callback``: the sensor succeeds
when the lag (or the oldest unprocessed record's age) crossed its threshold, and the notifier says by how much::

    KafkaBacklogSensor(..., min_records=100_000, min_age=timedelta(minutes=30), deferrable=True, soft_fail=True,
                       on_success_callback=[PipelineLagNotifier(), SlackNotifier(...)])

Read-only: they never change the store or the sink.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from airflow.sdk import BaseNotifier

from airflow_eo.operators.metrics import PREFIX, airflow_stats

log = logging.getLogger(__name__)


def where_it_stands(status: dict[str, Any]) -> str:
    """One line from ``airflow eo status -o json``'s document."""
    last = status.get("last_batch")
    parts = [f"last committed batch {last['batch_id']} at {last['committed_at']}" if last
             else "no committed batch yet", f"lag {status.get('lag')} offsets"]
    if status.get("unfinished"):
        parts.append("unfinished batch " + ", ".join(str(u["batch_id"]) for u in status["unfinished"]))
    if status.get("in_doubt"):
        parts.append(f"{len(status['in_doubt'])} in-doubt branch(es): see `airflow eo recover`")
    return "; ".join(parts)


def _status(pipeline_id: str, offset_store_conn_id: str | None, kafka_conn_id: str | None) -> dict[str, Any]:
    from airflow_eo.hooks.operations import pipeline_operations

    ops = pipeline_operations(offset_store_conn_id, kafka_conn_id, actor="deadline-alert", read_only=True,
                              error_details=False)
    status = ops.status(pipeline_id).to_dict()
    history = ops.history(pipeline_id, limit=5).to_dict()
    committed = [b for b in history["batches"] if b["state"] == "committed"]
    return {**status, "last_batch": committed[0] if committed else None}


def pipeline_of_run(default: str, run: Any, conf_key: str | None) -> str:
    """The pipeline a DAG run served: the run's conf ``conf_key`` when it names one (a DAG whose task takes its
    ``pipeline_id`` from the run's conf, ``"{{ params.pipeline_id }}"``), else ``default`` (the DAG's own). A conf
    value that is no valid pipeline id is not used (the default is named, and a warning says why)."""
    from airflow_eo.core.errors import ConfigurationError
    from airflow_eo.core.identifiers import validate_pipeline_id

    conf = run.get("conf") if isinstance(run, dict) else getattr(run, "conf", None)
    chosen = (conf or {}).get(conf_key) if conf_key else None
    if chosen is None:
        return default
    try:
        return validate_pipeline_id(str(chosen))
    except ConfigurationError as exc:
        log.warning("the run's conf %s=%r is no pipeline id (%s): the alert names %s", conf_key, chosen, exc, default)
        return default


async def pipeline_deadline_missed(pipeline_id: str, context: dict[str, Any] | None = None,
                                   offset_store_conn_id: str | None = None,
                                   kafka_conn_id: str | None = None, conf_key: str | None = "pipeline_id") -> str:
    """Log (at error level) and count ``airflow_eo.deadline_missed`` for a run of the pipeline's DAG that missed
    its deadline, with where the pipeline stands; returns that line, which Airflow keeps with the callback (a
    string: Airflow 3.3.2's triggerer stores the result as text, and exits on a dict).

    :param pipeline_id: the pipeline the DAG runs (the callback's kwargs are not templated).
    :param context: what Airflow passes (the DAG run, with its conf, and the deadline).
    :param offset_store_conn_id: the offset store's connection (None: ``[eo] offset_store_conn_id``).
    :param kafka_conn_id: the Kafka connection (None: ``[eo] kafka_conn_id``).
    :param conf_key: a run whose conf has this key served the pipeline it names, and the alert names that one
        (:func:`pipeline_of_run`); None: always ``pipeline_id``.
    """
    run = (context or {}).get("dag_run") or {}
    run_id = run.get("dag_run_id") or run.get("run_id") if isinstance(run, dict) else getattr(run, "run_id", None)
    pipeline_id = pipeline_of_run(pipeline_id, run, conf_key)
    try:
        status = await asyncio.to_thread(_status, pipeline_id, offset_store_conn_id, kafka_conn_id)
        said = where_it_stands(status)
    except Exception as exc:  # the alert still fires when the store cannot be read; say that instead
        said = f"its status could not be read ({type(exc).__name__}: {exc})"
    line = f"airflow_eo: run {run_id} of pipeline {pipeline_id} missed its deadline; {said}"
    log.error("%s", line)
    stats = airflow_stats()
    if stats is not None:
        stats.incr(f"{PREFIX}.deadline_missed", tags={"pipeline_id": pipeline_id})
    return line


def how_far_behind(pipeline_id: str, report: dict[str, Any], threshold: str) -> str:
    """One line from a ``KafkaBacklogSensor``'s XCom (``{"lag": {"topic[p]": n}, "total": n,
    "oldest_age_seconds": s}``) and its threshold's description."""
    age = report.get("oldest_age_seconds")
    worst = sorted(report.get("lag", {}).items(), key=lambda kv: -kv[1])[:5]
    return (f"airflow_eo: pipeline {pipeline_id} is behind: {report.get('total')} records wait"
            + ("" if age is None else f", the oldest {age:.0f} s old")
            + f" (alert at {threshold}); most behind: " + ", ".join(f"{k}={v}" for k, v in worst))


class PipelineLagNotifier(BaseNotifier):
    """Log (at error level) and count ``airflow_eo.lag_alert`` when a ``KafkaBacklogSensor`` fires: how many records
    wait, how old the oldest is, which partitions are most behind. Put it in the sensor's ``on_success_callback``,
    next to the notifiers that page (Slack, SMTP, ...)."""

    def notify(self, context: Any) -> None:
        task, ti = context["task"], context["ti"]
        report = ti.xcom_pull(task_ids=ti.task_id) or {}
        threshold = task.threshold.describe() if hasattr(task, "threshold") else "its threshold"
        line = how_far_behind(task.pipeline_id, report, threshold)
        self.log.error("%s", line)
        stats = airflow_stats()
        if stats is not None:
            stats.incr(f"{PREFIX}.lag_alert", tags={"pipeline_id": task.pipeline_id})
