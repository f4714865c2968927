"""``airflow eo verify``: whether the store, the consumer group, the sink's server and Airflow agree (read-only).

Separate from the other operations because it is the one that reads a pipeline's whole history and Airflow's runs;
each check is :mod:`airflow_eo.core.verify`'s, this module only reads what the checks compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_eo.core.abilities import InDoubtSink, role
from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import UNFINISHED, BatchState
from airflow_eo.core.config import Mode
from airflow_eo.core.pipeline_status import AuditEntry, PipelineInfo
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.sink_kinds import capabilities_of
from airflow_eo.core.verify import (
    Finding,
    audited_batches,
    audited_moves,
    check_branches,
    check_interval_tiling,
    check_mirror,
    check_open_transactions,
    check_runs,
    check_sink_commits,
    check_tiling,
    runs_in_question,
    runs_the_history_answers_for,
)
from airflow_eo.kafka.offsets import group_id
from airflow_eo.ops.context import OperationsContext, TaskRuns
from airflow_eo.ops.reports import VerifyReport

#: "Every row" for the reads of ``verify``, which checks a pipeline's whole history.
ALL_ROWS = 2**62


@dataclass(frozen=True)
class _Verified:
    """One check of ``verify``: its findings and what it checked, or why it could not."""

    findings: list[Finding] = field(default_factory=list)
    checked: str | None = None
    unchecked: str | None = None



class PipelineVerification:
    """``verify`` of one pipeline at a time.

    :param context: the store, the source cluster and the sinks.
    :param runs: where the pipelines' tasks ran (Airflow's metadata database); None: the batches are not compared
        with the runs.
    """

    def __init__(self, context: OperationsContext, runs: TaskRuns | None = None) -> None:
        self.context = context
        self.store = context.store
        self.runs = runs

    def verify(self, pipeline_id: str) -> VerifyReport:
        """Whether the store, the consumer group, the sink's server and Airflow agree (read-only); each check is
        :mod:`airflow_eo.core.verify`'s. A check whose dependency cannot be read is listed in ``unchecked``.

        :param pipeline_id: the pipeline.
        """
        info = self.store.pipeline(pipeline_id)
        batches = [b.record for b in self.store.batch_history(pipeline_id, ALL_ROWS)]
        audit = self.store.audit_log(pipeline_id, ALL_ROWS)
        committed = self.store.committed_offsets(pipeline_id)
        parts = [self._verify_tiling(info, batches, committed, audit), self._verify_mirror(info, batches, committed),
                 self._verify_in_doubt(info, batches), self._verify_runs(info, batches, audit)]
        return VerifyReport(pipeline_id, [p.checked for p in parts if p.checked],
                            [f for p in parts for f in p.findings], [p.unchecked for p in parts if p.unchecked])

    def _verify_tiling(self, info: PipelineInfo, batches: list[BatchRecord], committed: Mapping[TopicPartition, int],
                       audit: list[AuditEntry]) -> _Verified:
        if info.mode is Mode.INTERVAL:
            return _Verified(check_interval_tiling(batches), "tiling: committed intervals never overlap, adjacent "
                                                             "ones meet")
        return _Verified(check_tiling(batches, committed, audited_moves(audit)),
                         f"tiling: {sum(b.state is BatchState.COMMITTED for b in batches)} committed batches")

    def _verify_mirror(self, info: PipelineInfo, batches: list[BatchRecord],
                       committed: Mapping[TopicPartition, int]) -> _Verified:
        if info.mode is Mode.INTERVAL:
            # Nothing to compare, not a check that failed to run: `verify` of a healthy interval pipeline exits 0.
            return _Verified(checked="mirror: not applicable (an interval-mode pipeline keeps no consumer group)")
        group = group_id(info.pipeline_id)
        capabilities = capabilities_of(info.sink)
        read = {r.key for b in batches if b.state is BatchState.COMMITTED for r in b.ranges if r.size}
        without_records = ({k for k in committed if k not in read}
                           if capabilities is not None and capabilities.consumer_group else set())
        try:
            offsets = self.context.source().group_offsets(info.pipeline_id, committed)
        except Exception as exc:
            return _Verified(unchecked=f"mirror: the offsets of group {group} could not be read "
                                       f"({self.context.said(exc, 'group offsets')})")
        return _Verified(check_mirror(group, committed, offsets, without_records),
                         f"mirror: group {group}, {len(committed)} partitions")

    def _verify_in_doubt(self, info: PipelineInfo, batches: list[BatchRecord]) -> _Verified:
        capabilities = capabilities_of(info.sink)
        if info.sink is None or capabilities is None:
            return _Verified(unchecked="in-doubt: the store does not know the pipeline's sink yet")
        if not capabilities.in_doubt_branches and not capabilities.consumer_group:
            return _Verified(checked=f"in-doubt: {info.sink.kind} leaves nothing in doubt")
        try:
            if capabilities.in_doubt_branches:
                sink = role(self.context.connections.sink(info.pipeline_id, info.sink), InDoubtSink)
                return _Verified(check_branches(sink.in_doubt(info.pipeline_id), {b.batch_id: b for b in batches}),
                                 f"in-doubt: prepared branches on {info.sink.kind}'s server")
            group = self.context.kafka_group(info.pipeline_id, info)
            assert group is not None  # a consumer_group kind
            unfinished = [b for b in batches if b.state in UNFINISHED]
            findings = check_sink_commits(unfinished, group.committed_batches(unfinished) if unfinished else ())
            findings += check_open_transactions(group.open_transactions(), unfinished)
            return _Verified(findings, "in-doubt: no Kafka transaction committed a batch the store has not recorded, "
                                       "none is open on the output topic between batches")
        except Exception as exc:
            return _Verified(unchecked=f"in-doubt: the sink could not be read ({self.context.said(exc, 'in-doubt')})")

    def _verify_runs(self, info: PipelineInfo, batches: list[BatchRecord], audit: list[AuditEntry]) -> _Verified:
        owner = info.owned_by
        if self.runs is None:
            return _Verified(unchecked="runs: Airflow's metadata database is not at hand here")
        if owner is None:
            return _Verified(unchecked="runs: the store does not know the pipeline's DAG and task apart (its next "
                                       "run records them)")
        try:
            runs = self.runs.task_runs(owner.dag_id, owner.task_id)
        except Exception as exc:
            return _Verified(unchecked="runs: Airflow's runs could not be read "
                                       f"({self.context.said(exc, 'Airflow runs')})")
        runs = runs_the_history_answers_for(runs, batches, audit)
        questioned = runs_in_question(runs, batches, info.pipeline_id)
        elsewhere: dict[str, str] = {}
        if questioned:  # the task's other pipeline ids (edited, templated, renamed): their runs are theirs
            others = [p.pipeline_id for p in self.store.pipelines() if p.pipeline_id != info.pipeline_id
                      and (p.owned_by == owner or (p.owned_by is None and p.owner == info.owner))]
            elsewhere = self.store.runs_recorded(others, questioned)
        return _Verified(check_runs(runs, batches, audited_batches(audit), info.pipeline_id, elsewhere),
                         f"runs: {len(runs)} runs of {owner.dag_id}.{owner.task_id}")
