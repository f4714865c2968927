"""What the micro-batch operator does once its batch committed: metrics, the consumer-group mirror, the history's
retention. The batch is committed before any of these runs, so none of them fails the task: a failure is logged
(and counted where a metric says so) and the next batch tries again. Each logs through the task's own logger
(``log``), so what it says is in the task's log."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from airflow_eo.core.batch import BatchSummary
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import ConfigurationError, OperationError
from airflow_eo.core.history import check_retention
from airflow_eo.core.orphans import parse_duration
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.sink_kinds import capabilities_of
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.kafka.offsets import group_id
from airflow_eo.operators.metrics import emit_batch_metrics, emit_group_mirror_failure


class TaskLog(Protocol):
    """The task's logger (an operator's ``self.log``), as these functions use it."""

    def info(self, event: Any, *args: Any, **kw: Any) -> Any: ...

    def warning(self, event: Any, *args: Any, **kw: Any) -> Any: ...


def retention_seconds(value: timedelta | float | str | None, where: str = "history_retention") -> float | None:
    """``history_retention`` (a timedelta, seconds, or ``90d``-style text; None or ``""``: off) in seconds, at least a
    day (:func:`~airflow_eo.core.history.check_retention`).

    :raises ConfigurationError: saying what is expected.
    """
    if value is None or value == "":
        return None
    try:
        seconds = value.total_seconds() if isinstance(value, timedelta) else parse_duration(str(value))
        check_retention(seconds)
    except OperationError as exc:
        raise ConfigurationError(f"{where}={value!r}: {str(exc).replace('--older-than ', '')}") from None
    return seconds


#: the store's committed offsets of the batch's pipeline, read at most once for what runs after its commit
CommittedOffsets = Callable[[], Mapping[TopicPartition, int]]


def emit_metrics(summary: BatchSummary, committed: CommittedOffsets, kafka_hook: KafkaClusterHook, mode: Mode,
                 topics: Sequence[str], starting_offsets: str | int, log: TaskLog) -> None:
    """Batch metrics through Airflow's ``Stats`` (``airflow_eo/operators/metrics.py``)."""
    try:
        lag = None
        if mode is Mode.CONTINUOUS and not summary.already_committed:
            # Committed offsets first: a last stable offset read after them is never below them.
            lag = kafka_hook.backlog(topics, committed(), starting_offsets)
        emit_batch_metrics(summary, lag)
    except Exception:
        log.warning("could not emit the batch's metrics", exc_info=True)


def mirror_group(summary: BatchSummary, committed: CommittedOffsets, kafka_hook: KafkaClusterHook, mode: Mode,
                 sink: SinkRecord, log: TaskLog) -> None:
    """The store's committed offsets into the consumer group ``airflow_eo.<pipeline_id>``, where lag tools
    (kafka-consumer-groups, Burrow, exporters) look; never read back."""
    capabilities = capabilities_of(sink)
    if mode is Mode.INTERVAL or (capabilities is not None and capabilities.consumer_group):
        return  # an interval has no position to show; the Kafka sink commits the group in its own transaction
    try:
        kafka_hook.get_offset_source().mirror_group_offsets(summary.pipeline_id, committed())
    except Exception:
        log.warning("the consumer group %s still shows the offsets before this batch (lag tools read it; the offset "
                    "store, which is the truth, has the batch): the next run moves it", group_id(summary.pipeline_id),
                    exc_info=True)
        emit_group_mirror_failure(summary.pipeline_id)


def keep_history(summary: BatchSummary, retention_s: float | None, offset_store_conn_id: str, kafka_conn_id: str,
                 actor: str, log: TaskLog) -> None:
    """``history_retention``: a bounded share of the pipeline's history beyond it goes (``airflow eo prune``'s
    rules: never what decides in-doubt work, never the last committed batch), audited by ``actor``."""
    if retention_s is None or summary.already_committed:
        return
    try:
        from airflow_eo.hooks.operations import pipeline_operations
        from airflow_eo.ops.history import prune_after_batch

        ops = pipeline_operations(offset_store_conn_id, kafka_conn_id, actor=actor)
        pruned = prune_after_batch(ops, summary.pipeline_id, retention_s, summary.batch_id)
        if pruned.batches or pruned.audit_rows or pruned.dead_letters:
            log.info("history_retention: %d batches, %d audit rows and %d dead letters of %s older than %gs removed",
                     pruned.batches, pruned.audit_rows, pruned.dead_letters, summary.pipeline_id, retention_s)
    except Exception:
        log.warning("history_retention: the history of %s beyond %gs was not pruned this time (the next batch tries "
                    "again; `airflow eo prune` does it by hand)", summary.pipeline_id, retention_s, exc_info=True)
