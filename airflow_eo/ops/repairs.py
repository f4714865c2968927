"""``airflow eo recover`` and ``airflow eo rewind``: the two repairs of one pipeline, each taking its epoch with an
audit row, and the plan an approver approves (:func:`recovery_plan`).

Separate from the reads (``service.py``) because these are the operations that change the store, the sink and the
Kafka group; every decision is the core's (:func:`~airflow_eo.core.protocol.recover_pipeline`,
:mod:`airflow_eo.core.rewind`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from airflow_eo.core.config import Mode
from airflow_eo.core.errors import OperationError
from airflow_eo.core.protocol import recover_pipeline
from airflow_eo.core.rewind import DOUBLE_COUNT_FLAG, RewindKind, RewindTarget, check_rewind, plan_rewind
from airflow_eo.kafka.offsets import group_id
from airflow_eo.ops.context import OperationsContext, age_of, topics_of
from airflow_eo.ops.reports import InDoubtBranch, RecoverReport, RewindReport, UnfinishedBatch

log = logging.getLogger(__name__)

#: How many of the newest batch rows a recovery report reads for the batches it names.
RECENT_BATCHES = 500


class PipelineRepairs:
    """``recover`` and ``rewind`` of one pipeline at a time.

    :param context: the store, the source cluster and the sinks.
    :param actor: who runs them (recorded in ``eo_audit``): an OS user, an Airflow user.
    """

    def __init__(self, context: OperationsContext, actor: str) -> None:
        self.context = context
        self.store = context.store
        self.actor = actor

    # ------------------------------------------------------------------ repairs

    def recover(self, pipeline_id: str, apply: bool = False, reason: str | None = None,
                approved_plan: Mapping[str, Any] | None = None) -> RecoverReport:
        """Resolve in-doubt branches and unfinished batches now (``apply``), exactly as the pipeline's next attempt
        would, or show what that would do (the default).

        Applying takes the epoch (fencing any running attempt) in the same store transaction that writes the
        audit row (what it is about to do), then runs the attempt's step 2,
        :func:`~airflow_eo.core.protocol.recover_pipeline`, without a run of its own: branches of
        committed batches are committed, every other branch rolled back, batches the sink committed
        rolled forward, every other unfinished batch aborted; the audit row then records what it did.

        :param pipeline_id: the pipeline.
        :param apply: change the sink and the store (else a dry run).
        :param reason: why (required to apply; recorded in the audit row).
        :param approved_plan: the plan a person approved (:func:`recovery_plan` of the dry run they read): applied
            only while recovery would do exactly that, checked before and again after the epoch is taken (a batch
            planned or prepared since is nobody's to abort); else :class:`OperationError`, nothing changed.
        """
        if apply and not (reason or "").strip():
            raise OperationError("recover --apply needs --reason TEXT (recorded in the audit log)")
        info = self.store.pipeline(pipeline_id)
        if info.mode is Mode.INTERVAL:
            raise OperationError(f"pipeline {pipeline_id!r} runs in interval mode: an interval's unfinished batch is "
                                 "resumed by that interval's next run, and its (upsert) sink leaves nothing in doubt")
        if info.sink is None:
            raise OperationError(f"the offset store does not know pipeline {pipeline_id!r}'s sink (its last run "
                                 "predates sink recording), so it cannot run the sink's recovery; the pipeline's "
                                 "next run recovers it")
        notes: list[str] = []
        before = RecoverReport(pipeline_id, True, None, self.context.in_doubt(info, notes),
                               self.context.unfinished(info, notes))
        if not apply:
            return before
        assert reason is not None
        _check_approved(approved_plan, before, "since the dry run that was approved")
        if not before.branches and not before.batches:  # nothing to do: fence no running attempt for nothing
            return replace(before, dry_run=False)
        sink = self.context.connections.sink(pipeline_id, info.sink)
        # Fences every running attempt (owner and sink unchanged); on record before anything changes.
        epoch = self.store.take_audited(pipeline_id, self.actor, "recover", reason.strip(),
                                        {**_recovery_details(before), "completed": False})
        log.info("pipeline %s taken with epoch %d to recover it", pipeline_id, epoch)
        if approved_plan is not None:  # an attempt that planned between the check and the take: fenced, not undone
            _check_approved(approved_plan, RecoverReport(pipeline_id, True, None, self.context.in_doubt(info, notes),
                                                         self.context.unfinished(info, notes)),
                            f"while the pipeline was being taken (epoch {epoch} taken, nothing else changed)")
        # Recovery itself; the report is what it decided and did (its decisions, returned), with each branch's age.
        # The batch rows as recovery finds them (newest first; in-doubt branches are of recent batches).
        found = {b.record.batch_id: b for b in self.store.batch_history(pipeline_id, RECENT_BATCHES)}
        recovery = recover_pipeline(self.store, sink, pipeline_id, epoch, run_id=None)
        now = datetime.now(timezone.utc)
        branches = [InDoubtBranch(d, age_of(d.epoch, found.get(d.batch_id), now)) for d in recovery.branches]
        batches = [UnfinishedBatch(found[d.batch_id].record, found[d.batch_id].updated_at, d.action, d.reason)
                   for d in recovery.batches if d.batch_id in found]
        left = [b.decision.xid for b in self.context.in_doubt(info, notes)]
        report = RecoverReport(pipeline_id, False, epoch, branches, batches, left)
        self.store.complete_audit(pipeline_id, epoch, "recover", {**_recovery_details(report), "completed": True})
        return report

    def rewind(self, pipeline_id: str, target: RewindTarget, *, apply: bool = False, reason: str | None = None,
               allow_double_count: bool = False) -> RewindReport:
        """Move the committed offsets (``apply``), or show what that would do (the default).

        Applying takes the epoch (fencing any running attempt) in the same store transaction that
        moves the offsets and records the audit row; it is refused while a batch is unfinished, for
        interval-mode pipelines, and, when it reprocesses offsets, for accumulating sinks unless
        ``allow_double_count`` (:func:`~airflow_eo.core.rewind.check_rewind`).

        :param pipeline_id: the pipeline.
        :param target: where to.
        :param apply: change the store (else a dry run).
        :param reason: why (required to apply; recorded in the audit row).
        :param allow_double_count: reprocess into an accumulating sink anyway.
        """
        info = self.store.pipeline(pipeline_id)
        committed = self.store.committed_offsets(pipeline_id)
        latest = self.store.batch_history(pipeline_id, 1)
        topics = topics_of(committed, latest[0] if latest else None)
        if not topics:
            raise OperationError(f"pipeline {pipeline_id!r} has not planned any batch yet: there is nothing to rewind")
        broker = self.context.require_broker(topics)
        at_time = None
        if target.kind is RewindKind.DATETIME:
            if target.at is None:
                raise OperationError("a rewind to a datetime needs the datetime (RewindTarget.at is None)")
            source = self.context.source()
            at_time = source.offsets_for_time(source.partitions(topics), int(target.at.timestamp() * 1000))
        plan = plan_rewind(pipeline_id, target, list(broker.values()), committed, at_time)
        refusal = None
        try:
            check_rewind(plan, info.mode, self.store.unfinished_batches(pipeline_id), info.sink, allow_double_count)
        except OperationError as exc:
            refusal = str(exc)
        if not apply:
            return RewindReport(plan, False, refusal)
        if refusal is not None:
            raise OperationError(refusal)
        if not plan.moved:
            return RewindReport(plan, False, notes=["every partition is already there: nothing to change"])
        if not reason or not reason.strip():
            raise OperationError("a rewind that changes offsets needs --reason (recorded in the audit log)")
        group = self.context.kafka_group(pipeline_id, info)
        moved_group = False

        def move_group() -> None:
            # Recovery compares unfinished batches with the group's offsets: they follow the store's. Moved last,
            # under the store's lock once its checks passed: a refused rewind never moves the group (a partition
            # the store never committed has no group offset to go back to).
            nonlocal moved_group
            if group is not None:
                moved_group = True
                group.move_group_offsets({(c.topic, c.partition): c.new for c in plan.moved})

        try:
            epoch = self.store.rewind(plan, self.actor, reason.strip(), check=lambda found, unfinished: check_rewind(
                plan, found.mode, unfinished, found.sink, allow_double_count),
                overrides=[DOUBLE_COUNT_FLAG] if allow_double_count else [], before_commit=move_group)
        except BaseException:
            if group is not None and moved_group:  # the store's commit failed: put the group back where it is
                try:
                    group.move_group_offsets({(c.topic, c.partition): c.old for c in plan.moved if c.old is not None})
                except Exception:  # the store's failure is what to report; this only needs saying
                    log.exception("could not move the Kafka group of %s back to the store's offsets: run the rewind "
                                  "again, or `airflow eo recover` before the pipeline's next run", pipeline_id)
            raise
        notes = []
        if group is None:
            # Every other sink's offsets are mirrored into the same group for lag tools: it follows the rewind now
            # rather than at the next run (best effort: the store is the truth and already moved).
            try:
                self.context.source().mirror_group_offsets(pipeline_id, self.store.committed_offsets(pipeline_id))
            except Exception as exc:
                notes.append(f"the consumer group {group_id(pipeline_id)} still shows the old offsets "
                             f"({self.context.said(exc, 'group mirror')}); the next run moves it")
        return RewindReport(plan, True, epoch=epoch, notes=notes)

    # ------------------------------------------------------------------ helpers

def _recovery_details(report: RecoverReport) -> dict[str, Any]:
    return {"branches": [b.to_dict() for b in report.branches], "batches": [b.to_dict() for b in report.batches]}



def recovery_plan(report: RecoverReport) -> dict[str, list[list[Any]]]:
    """What a recovery does, as an approver approves it: each in-doubt branch's xid and action, each unfinished
    batch's id, epoch, run and action (JSON, for an XCom)."""
    return {"branches": sorted([b.decision.xid, b.decision.action.value] for b in report.branches),
            "batches": sorted([b.record.batch_id, b.record.epoch, b.record.run_id, b.action.value]
                              for b in report.batches)}


def _check_approved(approved: Mapping[str, Any] | None, fresh: RecoverReport, when: str) -> None:
    """Refuse a recovery that is not the approved one (:func:`recovery_plan`)."""
    if approved is None:
        return
    given = {key: sorted(list(item) for item in approved.get(key) or []) for key in ("branches", "batches")}
    now = recovery_plan(fresh)
    if given != now:
        raise OperationError(f"pipeline {fresh.pipeline_id!r}: the recovery changed {when}: approved {given}, now "
                             f"{now}. Nothing was applied; run the dry run again and have it approved")
