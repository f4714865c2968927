"""Operating pipelines: the read models and repair actions over the offset store, Kafka and the sinks.

The one place for operations: ``airflow eo`` (``airflow_eo/cli``) is a thin layer over
:class:`PipelineOperations`, and a UI would be another. Every decision comes from the core
(``airflow_eo/core/recovery.py``: what happens to an in-doubt branch, lag, what a rewind moves and
when it is refused), and :meth:`PipelineOperations.recover` runs the very step 2 of a task attempt
(:func:`airflow_eo.core.protocol.recover_pipeline`). This package does the I/O through the adapters and
imports nothing of Airflow: where the connections come from is :class:`Connections`' business
(``airflow_eo/hooks/operations.py`` reads Airflow connections).

This module holds the reads (pipelines, status, history, dead letters, the UI's page) and the one entry point,
:class:`PipelineOperations`, which hands each other operation to its collaborator: ``verification.py``
(``verify``), ``repairs.py`` (``recover``, ``rewind``), ``orphan_recovery.py`` (``verify --all``,
``recover --orphans``), all reading through ``context.py``; the reports are ``reports.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from airflow_eo.core.abilities import DeadLetterTable, role
from airflow_eo.core.config import Mode
from airflow_eo.core.errors import OperationError
from airflow_eo.core.headers import decode_headers
from airflow_eo.core.pipeline_status import PartitionStatus, partition_status
from airflow_eo.core.rewind import RewindTarget
from airflow_eo.core.sink_kinds import capabilities_of
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.ops.context import Connections, OperationsContext, TaskRuns, topics_of
from airflow_eo.ops.orphan_recovery import OrphanRecovery
from airflow_eo.ops.repairs import PipelineRepairs, recovery_plan
from airflow_eo.ops.reports import (
    History,
    InDoubtReport,
    OrphansReport,
    PipelineOverview,
    PipelinePage,
    PipelineStatus,
    RecoverReport,
    RewindReport,
    VerifyReport,
    total_lag,
)
from airflow_eo.ops.verification import PipelineVerification

# Outside callers (DAGs such as dags/recover_with_approval.py, hooks) import these from here.
__all__ = ["Connections", "PipelineOperations", "TaskRuns", "recovery_plan"]


class PipelineOperations:
    """Read models and repair actions of the pipelines in one offset store.

    :param connections: the store, the source cluster and the sinks.
    :param actor: who runs the operations (recorded in ``eo_audit``): an OS user, an Airflow user.
    :param runs: where the pipelines' tasks ran (Airflow's metadata database); None: ``verify`` does not compare
        the batches with the runs.
    :param error_details: whether a note about a dependency that could not be read (a sink database, Kafka)
        quotes the error's text (the CLI: its user holds the connections) or gives only its kind and a reference
        to the full text in this process's log (the UI tab: every reader of the DAG sees the notes, and an error's
        text names hosts and users).
    """

    def __init__(self, connections: Connections, actor: str, error_details: bool = True,
                 runs: TaskRuns | None = None) -> None:
        self.runs = runs
        self.actor = actor
        self.error_details = error_details
        self.context = OperationsContext(connections, error_details)
        self.store = self.context.store
        self.verification = PipelineVerification(self.context, runs)
        self.repairs = PipelineRepairs(self.context, actor)
        self.orphans = OrphanRecovery(self.context, self.repairs, actor)

    @property
    def connections(self) -> Connections:
        """The connections every operation reads through (one place: the context its collaborators share)."""
        return self.context.connections

    @connections.setter
    def connections(self, connections: Connections) -> None:
        self.context.connections = connections

    def source(self) -> KafkaOffsetSource:
        """The source cluster's offsets (connected on first use: not every command needs Kafka)."""
        return self.context.source()

    # ------------------------------------------------------------------ reads

    def pipelines(self) -> list[PipelineOverview]:
        """Every pipeline in the store, with its newest batch and its total lag."""
        infos = self.store.pipelines()
        committed = self.store.all_committed_offsets()
        latest = self.store.latest_batches()
        topics = {p.pipeline_id: topics_of(committed.get(p.pipeline_id, {}), latest.get(p.pipeline_id))
                  for p in infos if p.mode is not Mode.INTERVAL}
        broker, _ = self.context.broker_offsets(sorted({t for ts in topics.values() for t in ts}))
        overview = []
        for info in infos:
            lag = None
            if info.pipeline_id in topics and broker is not None:
                parts = [p for p in broker.values() if p.topic in topics[info.pipeline_id]]
                lag = total_lag(partition_status(parts, committed.get(info.pipeline_id, {})))
            overview.append(PipelineOverview(info, latest.get(info.pipeline_id), lag))
        return overview

    def status(self, pipeline_id: str) -> PipelineStatus:
        """Partitions (committed, last stable and log-start offsets, lag), unfinished batches and in-doubt branches.

        :param pipeline_id: the pipeline.
        """
        info = self.store.pipeline(pipeline_id)
        notes: list[str] = []
        committed = self.store.committed_offsets(pipeline_id)
        partitions: list[PartitionStatus] = []
        if info.mode is Mode.INTERVAL:
            notes.append("interval mode: each batch is a data interval, there is no committed position (see history)")
        else:
            latest = self.store.batch_history(pipeline_id, 1)
            topics = topics_of(committed, latest[0] if latest else None)
            if not topics:
                notes.append("no batch planned yet: the store does not know the pipeline's topics")
            broker, note = self.context.broker_offsets(topics)
            notes.extend([note] if note else [])
            partitions = partition_status(None if broker is None else list(broker.values()), committed)
            lost = [p for p in partitions if p.lost]
            if lost:
                notes.append("records were deleted by retention before the pipeline read them: "
                             + ", ".join(f"{p.topic}[{p.partition}] {p.lost} offsets" for p in lost)
                             + "; the next batch fails unless skip_lost_records=True")
        unfinished = self.context.unfinished(info, notes)
        in_doubt = self.context.in_doubt(info, notes)
        table = self.context.table(info)
        if table is not None:
            try:
                notes.append(table.table_state(info.pipeline_id))
            except Exception as exc:
                notes.append(f"the sink's table is unknown ({self.context.said(exc, 'table')})")
        if info.sink is None:
            notes.append("the store does not know this pipeline's sink yet (its last run predates sink recording)")
        return PipelineStatus(info, partitions, unfinished, in_doubt, notes)

    def history(self, pipeline_id: str, limit: int = 20) -> History:
        """The newest batches and audit entries.

        :param pipeline_id: the pipeline.
        :param limit: at most this many of each.
        """
        info = self.store.pipeline(pipeline_id)
        return History(info, self.store.batch_history(pipeline_id, limit), self.store.audit_log(pipeline_id, limit))

    def dead_letters(self, pipeline_id: str, batch_id: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The pipeline's dead letters, from the table its sink declares (``eo_dead_letter`` by default).

        :param pipeline_id: the pipeline.
        :param batch_id: only this batch's.
        :param limit: at most this many.
        """
        info = self.store.pipeline(pipeline_id)
        if info.sink is None:
            raise OperationError(f"the offset store does not know pipeline {pipeline_id!r}'s sink yet (its last run "
                                 "predates sink recording): run it once, then its dead letters can be found")
        capabilities = capabilities_of(info.sink)
        if capabilities is None or not capabilities.dead_letters:
            raise OperationError(f"pipeline {pipeline_id!r} writes through {info.sink.kind}, which keeps no dead "
                                 "letters (its bad records fail the batch)")
        sink = role(self.connections.sink(pipeline_id, info.sink), DeadLetterTable)
        return [_dead_letter(row) for row in sink.dead_letters(pipeline_id, batch_id, limit) or []]

    def pipelines_of_dag(self, dag_id: str, task_ids: Sequence[str]) -> dict[str, str]:
        """The pipelines the DAG's tasks own (by DAG id and task id; a pipeline last taken before the store kept
        them apart, by its owner's text ``<dag_id>.<task_id>``, which a DAG ``a.b`` task ``c`` shares with DAG ``a``
        task ``b.c``, until its next run records them).

        :param dag_id: the DAG.
        :param task_ids: its tasks (whatever their operator class: subclasses of ours count).
        :return: pipeline id -> task id, in pipeline id order.
        """
        owners = {f"{dag_id}.{task_id}": task_id for task_id in task_ids}
        found = {}
        for p in sorted(self.store.pipelines(), key=lambda p: p.pipeline_id):
            if p.owned_by is not None:
                if p.owned_by.dag_id == dag_id and p.owned_by.task_id in task_ids:
                    found[p.pipeline_id] = p.owned_by.task_id
            elif p.owner in owners:
                found[p.pipeline_id] = owners[p.owner]
        return found

    def page(self, pipeline_id: str, limit: int = 20, task_id: str | None = None,
             verify: bool = False) -> PipelinePage:
        """Status, the newest ``limit`` batches and audit entries, and the newest dead letters of a pipeline.

        :param pipeline_id: the pipeline.
        :param limit: at most this many batches, audit entries and dead letters.
        :param task_id: the task that runs it (shown).
        :param verify: with :meth:`verify`'s report.
        """
        status = self.status(pipeline_id)
        dead_letters = None
        capabilities = capabilities_of(status.info.sink)
        if capabilities is not None and capabilities.dead_letters:
            try:
                dead_letters = self.dead_letters(pipeline_id, limit=limit)
            except Exception as exc:  # a sink database that is down must not hide the store's view
                status.notes.append(f"dead letters unknown: {self.context.said(exc, 'dead letters of ' + pipeline_id)}")
        return PipelinePage(status, self.history(pipeline_id, limit), dead_letters, task_id,
                            self.verify(pipeline_id) if verify else None)
    def verify(self, pipeline_id: str) -> VerifyReport:
        """Whether the store, the consumer group, the sink's server and Airflow agree (read-only): see
        :meth:`PipelineVerification.verify <airflow_eo.ops.verification.PipelineVerification.verify>`.

        :param pipeline_id: the pipeline.
        """
        return self.verification.verify(pipeline_id)

    # ------------------------------------------------------------------ every pipeline's in-doubt branches

    def in_doubt_everywhere(self, unknown_rollback: bool = False) -> InDoubtReport:
        """Every in-doubt branch of ours on every sink database of the store, attributed and decided (read-only):
        see :meth:`airflow_eo.ops.orphan_recovery.OrphanRecovery.in_doubt_everywhere`.

        :param unknown_rollback: decide a branch of a pipeline the store never knew as a rollback (else: left).
        """
        return self.orphans.in_doubt_everywhere(unknown_rollback)

    def recover_orphans(self, apply: bool = False, reason: str | None = None, unknown_rollback: bool = False,
                        older_than_s: float = 600.0, scan_interval_s: float = 5.0) -> OrphansReport:
        """Resolve every in-doubt branch of ours left on the store's sink databases (``apply``), or show what that
        would do (the default): see
        :meth:`OrphanRecovery.recover_orphans <airflow_eo.ops.orphan_recovery.OrphanRecovery.recover_orphans>`.
        """
        return self.orphans.recover_orphans(apply, reason, unknown_rollback, older_than_s, scan_interval_s)

    # ------------------------------------------------------------------ repairs

    def recover(self, pipeline_id: str, apply: bool = False, reason: str | None = None,
                approved_plan: Mapping[str, Any] | None = None) -> RecoverReport:
        """Resolve in-doubt branches and unfinished batches now (``apply``), exactly as the pipeline's next attempt
        would, or show what that would do (the default): see
        :meth:`PipelineRepairs.recover <airflow_eo.ops.repairs.PipelineRepairs.recover>`.
        """
        return self.repairs.recover(pipeline_id, apply, reason, approved_plan)

    def rewind(self, pipeline_id: str, target: RewindTarget, *, apply: bool = False, reason: str | None = None,
               allow_double_count: bool = False) -> RewindReport:
        """Move the committed offsets (``apply``), or show what that would do (the default): see
        :meth:`PipelineRepairs.rewind <airflow_eo.ops.repairs.PipelineRepairs.rewind>`.
        """
        return self.repairs.rewind(pipeline_id, target, apply=apply, reason=reason,
                                   allow_double_count=allow_double_count)


def _dead_letter(row: Mapping[str, Any]) -> dict[str, Any]:
    def text(value: Any) -> str | None:
        if value is None:
            return None
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes | bytearray) else str(value)

    try:  # None: not kept (a row written before the table had the column)
        headers = decode_headers(row.get("kafka_headers"))
    except ValueError:
        headers = None
    created = row.get("created_at")
    return {"batch_id": row["batch_id"], "topic": row["topic"], "partition": row["kafka_partition"],
            "offset": row["kafka_offset"], "key": text(row["record_key"]), "value": text(row["raw_value"]),
            "headers": None if headers is None else [{"key": k, "value": text(v)} for k, v in headers],
            "error": row["error"], "created_at": created.isoformat() if isinstance(created, datetime) else created}

