"""What every operation reads through: the offset store, the source cluster (connected on first use), a pipeline's
sink in the role its kind declares, and how a note quotes an error that kept something from being read.

Separate from the operations (``service.py``, ``verification.py``, ``orphan_recovery.py``, ``repairs.py``) because
each of them reads the same things the same way: status and recovery show the same unfinished batches and in-doubt
branches, and every note about a dependency that could not be read follows one ``error_details`` rule.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Protocol

from airflow_eo.core.abilities import ConsumerGroupSink, InDoubtSink, TableCommitSink, role
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.errors import ConfigurationError, OperationError
from airflow_eo.core.orphans import branch_age
from airflow_eo.core.pipeline_status import BatchInfo, PipelineInfo
from airflow_eo.core.planning import PartitionOffsets
from airflow_eo.core.protocol import Sink
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.recovery import decide_branch, decide_unfinished
from airflow_eo.core.sink_kinds import capabilities_of
from airflow_eo.core.stores import ManagedOffsetStore
from airflow_eo.core.verify import TaskRun
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.ops.reports import InDoubtBranch, UnfinishedBatch

log = logging.getLogger(__name__)


class Connections(Protocol):
    """Where the offset store, the source cluster and a pipeline's sink are (Airflow connections, for the CLI)."""

    def store(self) -> ManagedOffsetStore: ...
    def offset_source(self) -> KafkaOffsetSource: ...
    def sink(self, pipeline_id: str, record: SinkRecord) -> Sink:
        """The adapter of the recorded sink (its recovery is the one a task attempt runs), built by its kind."""


class TaskRuns(Protocol):
    """Where a pipeline's task ran (Airflow's metadata database, for ``verify``)."""

    def task_runs(self, dag_id: str, task_id: str) -> list[TaskRun]:
        """Every run of the task, with the task instance's state and the run's data interval."""




class OperationsContext:
    """The store, the source cluster and the sinks as every operation reads them.

    :param connections: the store, the source cluster and the sinks.
    :param error_details: whether a note about a dependency that could not be read (a sink database, Kafka)
        quotes the error's text (the CLI: its user holds the connections) or gives only its kind and a reference
        to the full text in this process's log (the UI tab: every reader of the DAG sees the notes, and an error's
        text names hosts and users).
    """

    def __init__(self, connections: Connections, error_details: bool = True) -> None:
        self.connections = connections
        self.error_details = error_details
        self.store = connections.store()
        self._source: KafkaOffsetSource | None = None

    def source(self) -> KafkaOffsetSource:
        """The source cluster's offsets (connected on first use: not every command needs Kafka)."""
        if self._source is None:
            self._source = self.connections.offset_source()
        return self._source

    def said(self, exc: Exception, what: str) -> str:
        """What a note says of an error: its text, or (without ``error_details``) its kind and the reference under
        which its text was logged here."""
        if self.error_details:
            return str(exc)
        reference = uuid.uuid4().hex[:8]
        log.warning("%s could not be read (reference %s)", what, reference, exc_info=exc)
        return f"{type(exc).__name__}; the details are in the log (reference {reference})"

    def broker_offsets(self, topics: Sequence[str]) -> tuple[dict[TopicPartition, PartitionOffsets] | None,
                                                               str | None]:
        """Log-start and last stable offsets of the topics' partitions; (None, why) when Kafka cannot tell."""
        if not topics:
            return {}, None
        try:
            source = self.source()
        except Exception as exc:
            return None, f"Kafka offsets unknown: {self.said(exc, 'Kafka offsets')}"
        found: dict[TopicPartition, PartitionOffsets] = {}
        missing = []
        for topic in topics:  # one topic at a time: a deleted topic must not hide the others
            try:
                found.update({p.key: p for p in source.partition_offsets([topic], "earliest")})
            except ConfigurationError:
                missing.append(topic)
            except Exception as exc:
                return None, f"Kafka offsets unknown: {self.said(exc, 'Kafka offsets of ' + topic)}"
        return found, (f"topic(s) {', '.join(missing)} not found on the broker" if missing else None)

    def require_broker(self, topics: Sequence[str]) -> dict[TopicPartition, PartitionOffsets]:
        broker, note = self.broker_offsets(topics)
        if broker is None or note:
            raise OperationError(f"cannot plan a rewind: {note}")
        return broker

    def kafka_group(self, pipeline_id: str, info: PipelineInfo) -> ConsumerGroupSink | None:
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None or not capabilities.consumer_group:
            return None
        return role(self.connections.sink(pipeline_id, info.sink), ConsumerGroupSink)

    def table(self, info: PipelineInfo) -> TableCommitSink | None:
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None or not capabilities.table_commits:
            return None
        return role(self.connections.sink(info.pipeline_id, info.sink), TableCommitSink)

    def unfinished(self, info: PipelineInfo, notes: list[str]) -> list[UnfinishedBatch]:
        """The unfinished batches and what recovery does with each (a Kafka sink may have committed one)."""
        batches = self.store.unfinished_batches(info.pipeline_id)
        if not batches:
            return []
        committed: set[int] = set()
        group = self.kafka_group(info.pipeline_id, info)
        if group is not None:
            try:
                committed = group.committed_batches(batches)
            except Exception as exc:
                notes.append(f"the Kafka sink's group offsets are unknown ({self.said(exc, 'group offsets')}): a "
                             "batch it committed would be "
                             "rolled forward by recovery, not aborted")
        table = self.table(info)
        if table is not None:
            try:
                committed = table.committed_batches(batches)
            except Exception as exc:
                notes.append(f"the sink's table is unknown ({self.said(exc, 'table')}): a batch it committed would "
                             "be rolled forward by recovery, not aborted")
        when = {b.record.batch_id: b.updated_at
                for b in self.store.batch_history(info.pipeline_id, len(batches), [b.batch_id for b in batches])}
        return [UnfinishedBatch(b, when.get(b.batch_id), *decide_unfinished(b, committed)) for b in batches]

    def in_doubt(self, info: PipelineInfo, notes: list[str]) -> list[InDoubtBranch]:
        """The pipeline's prepared branches on its sink's server, each with recovery's decision and its age."""
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None or not capabilities.in_doubt_branches:
            return []  # only two-phase sinks prepare branches
        sink = role(self.connections.sink(info.pipeline_id, info.sink), InDoubtSink)
        xids = sink.in_doubt(info.pipeline_id)
        batch_ids = sorted({x.batch_id for x in xids})
        found = {b.record.batch_id: b for b in self.store.batch_history(info.pipeline_id, len(batch_ids), batch_ids)}
        now = datetime.now(timezone.utc)
        return [InDoubtBranch(decide_branch(x, found[x.batch_id].record if x.batch_id in found else None),
                              age_of(x.epoch, found.get(x.batch_id), now)) for x in xids]


# --------------------------------------------------------------------------- JSON shapes


def topics_of(committed: Mapping[TopicPartition, int], latest: BatchInfo | None) -> list[str]:
    """The pipeline's topics as the store knows them: committed partitions and its newest batch's ranges."""
    found = {t for t, _ in committed}
    if latest is not None:
        found.update(r.topic for r in (*latest.record.ranges, *latest.record.skipped))
    return sorted(found)


def age_of(epoch: int, batch: BatchInfo | None, now: datetime) -> float | None:
    """How long the branch has been in doubt, about (:func:`~airflow_eo.core.orphans.branch_age` from its batch
    row); None without one."""
    if batch is None:
        return None
    return branch_age(None, epoch, batch.record.epoch, batch.created_at, batch.updated_at, now)

