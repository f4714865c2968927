"""``airflow eo retire`` and ``airflow eo rename``: a pipeline's end and its new name, over the operations.

The decisions are :mod:`airflow_eo.core.lifecycle`'s (is a run going on, may it go on, what goes); the store's
writes are one transaction each under the pipeline row's lock (:mod:`airflow_eo.sqlstore.lifecycle`); the in-doubt
work is resolved by :meth:`PipelineOperations.recover` (the attempt's own recovery, fenced, audited). This module
does the I/O in order and imports nothing of Airflow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from airflow_eo.core.batch_states import UNFINISHED
from airflow_eo.core.config import Mode
from airflow_eo.core.errors import OperationError
from airflow_eo.core.lifecycle import (
    DEFAULT_IDLE_S,
    OPERATIONS_TAKING_EPOCH,
    RENAME_ACTION,
    RETIRE_ACTION,
    BatchSeen,
    PipelineRows,
    RetirePlan,
    active_run,
    check_new_pipeline_id,
    rename_refusal,
    retire_plan,
    retire_refusal,
    seed_refusal,
)
from airflow_eo.core.pipeline_status import PipelineInfo
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.rewind import RewindKind, RewindPlan, RewindTarget, plan_rewind
from airflow_eo.kafka.offsets import group_id
from airflow_eo.ops.reports import RecoverReport
from airflow_eo.ops.service import PipelineOperations

log = logging.getLogger(__name__)

#: How many audit rows are read for the epochs operations took (the newest ones).
RECENT_AUDIT = 5


@dataclass(frozen=True)
class RetireReport:
    """What ``retire`` did (or, in a dry run, would do)."""

    pipeline_id: str
    dry_run: bool
    plan: RetirePlan
    refusal: str | None = None  # why --apply is (or was) refused
    recovery: RecoverReport | None = None  # its in-doubt work, resolved (or to resolve)
    epoch: int | None = None  # the epoch the retire took
    removed: dict[str, int] = field(default_factory=dict)  # table -> rows removed
    group_deleted: bool | None = None
    retired_at: datetime | None = None  # retired before this command
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "dry_run": self.dry_run, "refused": self.refusal,
                "plan": self.plan.to_dict(), "recovery": None if self.recovery is None else self.recovery.to_dict(),
                "epoch": self.epoch, "removed": dict(self.removed), "group_deleted": self.group_deleted,
                "retired_at": None if self.retired_at is None else self.retired_at.isoformat(timespec="seconds"),
                "notes": list(self.notes)}


@dataclass(frozen=True)
class RenameReport:
    """What ``rename`` did (or would do)."""

    old: str
    new: str
    dry_run: bool
    refusal: str | None = None
    sink_rows: dict[str, int] = field(default_factory=dict)  # table -> rows moved (or to move)
    epoch: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.old, "to": self.new, "dry_run": self.dry_run, "refused": self.refusal,
                "sink_rows": dict(self.sink_rows), "epoch": self.epoch, "notes": list(self.notes)}


@dataclass(frozen=True)
class SeedReport:
    """What ``seed`` did (or would do): the starting offsets of a pipeline that has not run in this store."""

    plan: RewindPlan
    dry_run: bool
    refusal: str | None = None
    epoch: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "dry_run": self.dry_run, "refused": self.refusal, "epoch": self.epoch,
                "notes": list(self.notes)}


class PipelineLifecycle:
    """Retire, bring back and rename the pipelines of one offset store.

    :param ops: the operations (store, Kafka, sinks, actor) these run over.
    """

    def __init__(self, ops: PipelineOperations) -> None:
        self.ops = ops
        self.store = ops.store

    # ------------------------------------------------------------------ retire

    def retire(self, pipeline_id: str, *, apply: bool = False, reason: str | None = None, dead_letters: bool = False,
               idle_s: float = DEFAULT_IDLE_S) -> RetireReport:
        """Retire the pipeline (``apply``), or show what that would do (the default).

        Refused while a run may be going on (:func:`~airflow_eo.core.lifecycle.active_run`). Applying resolves its
        in-doubt work as ``recover`` does (its epoch taken, audited), marks it retired under the pipeline row's lock
        (its next take is refused, :func:`~airflow_eo.core.lifecycle.retired_message`), audited with what it removes,
        then removes its consumer group, the seen ids and change positions its sink keeps and (``dead_letters``) its
        dead letters. Run again on a retired pipeline, it removes what is left.

        :param pipeline_id: the pipeline.
        :param apply: change the store, the sink and Kafka (else a dry run).
        :param reason: why (required to apply).
        :param dead_letters: remove its dead letters too.
        :param idle_s: how long the pipeline must have been quiet to count as not running.
        """
        if apply and not (reason or "").strip():
            raise OperationError("retire --apply needs --reason TEXT (recorded in the audit log)")
        info = self.store.pipeline(pipeline_id)
        unreadable: list[str] = []
        try:
            rows_sink = self._rows_sink(info)
            rows = rows_sink.pipeline_rows(pipeline_id, dead_letters) if rows_sink is not None else {}
        except Exception as exc:  # its database gone with its DAG: the retire still ends the pipeline
            rows_sink, rows = None, {}
            unreadable.append(f"the sink's rows of the pipeline cannot be read ({self._said(exc, 'sink rows')}): "
                              "they are not removed")
        group = None if info.mode is Mode.INTERVAL else group_id(pipeline_id)
        plan = retire_plan(info, group, rows_sink is not None, rows, dead_letters)
        plan = replace(plan, notes=[*plan.notes, *unreadable])
        if info.retired_at is not None:  # retired already: what may be left to remove
            if not apply:
                return RetireReport(pipeline_id, True, plan, retired_at=info.retired_at,
                                    notes=["retired already; --apply removes what is listed (again)"])
            assert reason is not None
            removed, deleted, notes = self._remove(info, plan, rows_sink)
            self.store.record_audit(pipeline_id, self.ops.actor, RETIRE_ACTION, reason.strip(),
                                    {**plan.to_dict(), "removed": removed, "group_deleted": deleted,
                                     "again": True, "completed": True})
            return RetireReport(pipeline_id, False, plan, removed=removed, group_deleted=deleted,
                                retired_at=info.retired_at, notes=notes)
        refusal = retire_refusal(info, self._activity(info, idle_s))
        recovery = self._recovery(info, apply=False)
        if not apply:
            return RetireReport(pipeline_id, True, plan, refusal, recovery)
        if refusal is not None:
            raise OperationError(refusal)
        assert reason is not None
        seen_epoch = info.epoch
        if recovery is not None and (recovery.branches or recovery.batches):
            recovery = self._recovery(info, apply=True, reason=reason.strip())
            assert recovery is not None
            if recovery.left:
                raise OperationError(f"pipeline {pipeline_id!r}: branches still in doubt after its recovery "
                                     f"({', '.join(recovery.left)}); it was not retired: run the command again")
            seen_epoch = recovery.epoch if recovery.epoch is not None else seen_epoch
        epoch = self.store.retire(pipeline_id, self.ops.actor, reason.strip(), seen_epoch,
                                  {**plan.to_dict(), "completed": False})
        log.info("pipeline %s retired under epoch %d", pipeline_id, epoch)
        removed, deleted, notes = self._remove(info, plan, rows_sink)
        self.store.complete_audit(pipeline_id, epoch, RETIRE_ACTION, {**plan.to_dict(), "removed": removed,
                                                                      "group_deleted": deleted, "completed": True})
        return RetireReport(pipeline_id, False, plan, None, recovery, epoch, removed, deleted, notes=notes)

    def undo_retire(self, pipeline_id: str, *, apply: bool = False, reason: str | None = None) -> RetireReport:
        """Bring a retired pipeline back (``apply``): its next run continues from its committed offsets."""
        info = self.store.pipeline(pipeline_id)
        plan = RetirePlan(pipeline_id, None, notes=["its next run continues from its committed offsets; its seen "
                                                    "ids (and dead letters) removed by the retire stay removed"])
        if info.retired_at is None:
            raise OperationError(f"pipeline {pipeline_id!r} is not retired: there is nothing to undo")
        if not apply:
            return RetireReport(pipeline_id, True, plan, retired_at=info.retired_at)
        if not (reason or "").strip():
            raise OperationError("retire --undo --apply needs --reason TEXT (recorded in the audit log)")
        assert reason is not None
        epoch = self.store.unretire(pipeline_id, self.ops.actor, reason.strip())
        return RetireReport(pipeline_id, False, plan, epoch=epoch, retired_at=info.retired_at)

    def _remove(self, info: PipelineInfo, plan: RetirePlan,
                rows_sink: PipelineRows | None) -> tuple[dict[str, int], bool | None, list[str]]:
        """Remove what the plan lists; a part that fails is a note (the retire stands; running it again retries)."""
        notes: list[str] = []
        removed: dict[str, int] = {}
        if rows_sink is not None:
            try:
                removed = rows_sink.remove_pipeline_rows(info.pipeline_id, plan.dead_letters)
            except Exception as exc:
                notes.append(f"the sink's rows of the pipeline were not removed ({self._said(exc, 'sink rows')}); "
                             "run the retire again")
        deleted = None
        if plan.consumer_group is not None:
            try:
                deleted = self.ops.source().delete_group(info.pipeline_id)
            except Exception as exc:
                notes.append(f"the consumer group {plan.consumer_group} was not deleted "
                             f"({self._said(exc, 'group')}); run the retire again")
        return removed, deleted, notes

    # ------------------------------------------------------------------ rename

    def rename(self, old: str, new: str, *, apply: bool = False, reason: str | None = None,
               idle_s: float = DEFAULT_IDLE_S) -> RenameReport:
        """Give pipeline ``old`` the id ``new`` (``apply``), or show what that would do: its offsets, batches, audit,
        its sink's seen ids, change positions and dead letters, and its consumer group's offsets move; its next batch
        (run under ``new``: change the task's ``pipeline_id=`` too) continues exactly where ``old`` stopped.

        Refused while a run may be going on, while ``old`` has in-doubt work (branches and batches carry its id:
        ``recover`` it first), and when ``new`` exists.
        """
        if apply and not (reason or "").strip():
            raise OperationError("rename --apply needs --reason TEXT (recorded in the audit log)")
        check_new_pipeline_id(new)
        info = self.store.pipeline(old)
        new_exists = bool(self.store.pipelines(new))
        refusal = rename_refusal(info, new, new_exists, self._activity(info, idle_s), self._in_doubt(info))
        rows_sink = self._rows_sink(info)
        rows = rows_sink.pipeline_rows(old, dead_letters=True) if rows_sink is not None and refusal is None else {}
        if not apply:
            return RenameReport(old, new, True, refusal, rows)
        if refusal is not None:
            raise OperationError(refusal)
        assert reason is not None
        moved: dict[str, int] = {}

        def refuse_existing(exists: bool) -> None:
            if exists:
                raise OperationError(rename_refusal(info, new, True, None, ()) or "")

        def move_sink_rows() -> None:  # last, under the store's lock: if it fails nothing moved in the store
            if rows_sink is not None:
                moved.update(rows_sink.move_pipeline_rows(old, new))

        try:
            epoch = self.store.rename(old, new, self.ops.actor, reason.strip(), info.epoch, refuse_existing,
                                      move_sink_rows)
        except BaseException:
            if moved and rows_sink is not None:  # the store's commit failed: the sink's rows go back
                try:
                    rows_sink.move_pipeline_rows(new, old)
                except Exception:
                    log.exception("the sink's rows of %s could not be moved back from %s: move them by hand", old, new)
            raise
        notes = self._move_group(info, new)
        self.store.complete_audit(new, epoch, RENAME_ACTION, {"from": old, "to": new, "sink_rows": moved,
                                                              "completed": True})
        return RenameReport(old, new, False, None, moved, epoch, notes)

    def _move_group(self, info: PipelineInfo, new: str) -> list[str]:
        """The consumer group follows the store: ``airflow_eo.<new>`` gets the committed offsets, the old one goes."""
        if info.mode is Mode.INTERVAL:
            return []
        notes = []
        try:
            self.ops.source().mirror_group_offsets(new, self.store.committed_offsets(new))
            self.ops.source().delete_group(info.pipeline_id)
        except Exception as exc:
            notes.append(f"the consumer group {group_id(info.pipeline_id)} was not moved to {group_id(new)} "
                         f"({self._said(exc, 'group')}); the next run of {new} writes its group")
        return notes

    # ------------------------------------------------------------------ seed (a pipeline moved from another store)

    def seed(self, pipeline_id: str, offsets: dict[TopicPartition, int], *, apply: bool = False,
             reason: str | None = None) -> SeedReport:
        """Give a pipeline that has not run in this store its starting offsets (``apply``), or show them: the
        pipeline's row is made (its first run records its owner, mode and sink) and the offsets are written as a
        rewind of partitions never committed, audited (``verify`` then explains where its batches start).

        :param pipeline_id: the pipeline (a new id: see docs/how-to/retire-and-rename.md, "Moving a pipeline").
        :param offsets: the next offset to read of every partition of its topics.
        :param apply: write them (else a dry run).
        :param reason: why (required to apply).
        """
        if apply and not (reason or "").strip():
            raise OperationError("seed --apply needs --reason TEXT (recorded in the audit log)")
        check_new_pipeline_id(pipeline_id)
        found = self.store.pipelines(pipeline_id)
        has_run = bool(found) and bool(self.store.committed_offsets(pipeline_id)
                                       or self.store.batch_history(pipeline_id, 1))
        topics = sorted({t for t, _ in offsets})
        broker = self.ops.source().partition_offsets(topics, "earliest") if topics else []
        target = RewindTarget(RewindKind.OFFSETS, offsets=offsets)
        refusal = seed_refusal(pipeline_id, found[0] if found else None, has_run, offsets, [p.key for p in broker])
        plan = plan_rewind(pipeline_id, target, broker, {}) if refusal is None else RewindPlan(pipeline_id, target, ())
        if not apply:
            return SeedReport(plan, True, refusal)
        if refusal is not None:
            raise OperationError(refusal)
        assert reason is not None

        def nothing_since(found_now: PipelineInfo, unfinished: list[Any]) -> None:
            if unfinished or found_now.retired_at is not None or found_now.mode is not None:
                raise OperationError(f"pipeline {pipeline_id!r} ran meanwhile; nothing was changed")

        self.store.create_pipeline(pipeline_id)
        epoch = self.store.rewind(plan, self.ops.actor, reason.strip(), check=nothing_since)
        notes = []
        try:
            self.ops.source().mirror_group_offsets(pipeline_id, self.store.committed_offsets(pipeline_id))
        except Exception as exc:
            notes.append(f"the consumer group {group_id(pipeline_id)} was not written ({self._said(exc, 'group')})"
                         "; the first run writes it")
        return SeedReport(plan, False, None, epoch, notes)

    # ------------------------------------------------------------------ facts

    def _activity(self, info: PipelineInfo, idle_s: float) -> str | None:
        """:func:`~airflow_eo.core.lifecycle.active_run` over the store's rows."""
        pipeline_id = info.pipeline_id
        unfinished = [b.batch_id for b in self.store.unfinished_batches(pipeline_id)]
        seen = {b.record.batch_id: b for b in self.store.batch_history(pipeline_id, len(unfinished), unfinished)}
        seen.update({b.record.batch_id: b for b in self.store.batch_history(pipeline_id, 1)})
        batches = [BatchSeen(b.record, b.updated_at) for b in seen.values()]
        taken_by_operations = [a.epoch for a in self.store.audit_log(pipeline_id, RECENT_AUDIT)
                               if a.epoch is not None and a.action in OPERATIONS_TAKING_EPOCH]
        return active_run(info, batches, taken_by_operations, datetime.now(timezone.utc), idle_s)

    def _recovery(self, info: PipelineInfo, apply: bool, reason: str | None = None) -> RecoverReport | None:
        """``recover``'s report (dry run, or applied); None where recover does not run (interval mode, a sink the
        store does not know: the store refuses their unfinished batches itself)."""
        if info.mode is Mode.INTERVAL or info.sink is None:
            return None
        return self.ops.recover(info.pipeline_id, apply=apply, reason=reason)

    def _said(self, exc: Exception, what: str) -> str:
        """How a note quotes an error (the operations' own rule: details or not)."""
        return self.ops.context.said(exc, what)

    def _in_doubt(self, info: PipelineInfo) -> list[str]:
        """The pipeline's in-doubt work, described (its branches, its unfinished batches)."""
        recovery = self._recovery(info, apply=False)
        if recovery is None:
            return [f"batch {b.batch_id} is {b.state.value}" for b in self.store.unfinished_batches(info.pipeline_id)
                    if b.state in UNFINISHED]
        return ([f"branch {b.decision.xid} ({b.decision.action.value})" for b in recovery.branches]
                + [f"batch {b.record.batch_id} is {b.record.state.value} ({b.action.value})"
                   for b in recovery.batches])

    def _rows_sink(self, info: PipelineInfo) -> PipelineRows | None:
        """The pipeline's sink, when it keeps rows keyed by the pipeline."""
        if info.sink is None:
            return None
        sink = self.ops.connections.sink(info.pipeline_id, info.sink)
        return sink if isinstance(sink, PipelineRows) else None
