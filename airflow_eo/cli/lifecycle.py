"""``airflow eo retire``, ``rename``, ``seed`` and ``prune``: arguments in, one
:class:`~airflow_eo.ops.lifecycle.PipelineLifecycle` call, output out (as ``airflow_eo/cli/commands.py``'s)."""

from __future__ import annotations

from typing import Any

from airflow.utils.cli import suppress_logs_and_warning
from airflow.utils.providers_configuration_loader import providers_configuration_loaded

from airflow_eo.cli.arguments import parse_offsets
from airflow_eo.cli.commands import IN_DOUBT_TITLE, _branches, _check_apply, _operation, _show
from airflow_eo.core.errors import OperationError
from airflow_eo.core.history import DEFAULT_CHUNK, check_retention
from airflow_eo.core.lifecycle import DEFAULT_IDLE_S
from airflow_eo.core.orphans import parse_duration
from airflow_eo.ops.history import HistoryPruner
from airflow_eo.ops.lifecycle import PipelineLifecycle
from airflow_eo.ops.service import PipelineOperations


def _idle_s(args: Any) -> float:
    if args.idle_for is None:
        return DEFAULT_IDLE_S
    try:
        return parse_duration(args.idle_for)
    except OperationError:
        raise OperationError(f"--idle-for {args.idle_for!r} is not a duration: give seconds (600) or a number with a "
                             "unit s, m, h or d (10m, 2h)") from None


def _check_retire_args(args: Any) -> None:
    _check_apply(args, "retire")
    _idle_s(args)
    if args.undo and args.dead_letters:
        raise OperationError("--undo and --dead-letters contradict each other (removed dead letters do not come back)")


def _check_rename_args(args: Any) -> None:
    _check_apply(args, "rename")
    _idle_s(args)


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation(check=_check_retire_args)
def retire(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo retire PIPELINE [--dead-letters] [--undo] [--apply --reason TEXT]``."""
    lifecycle = PipelineLifecycle(ops)
    if args.undo:
        report = lifecycle.undo_retire(args.pipeline_id, apply=args.apply, reason=args.reason)
        note = (f"brought back under epoch {report.epoch}; recorded in the audit log. Its next run continues from "
                "its committed offsets" if not report.dry_run else
                "dry run: nothing was changed; add --apply --reason TEXT to bring it back")
        _show(args.output, report.to_dict(), [], [*report.plan.notes, note])
        return
    report = lifecycle.retire(args.pipeline_id, apply=args.apply, reason=args.reason, dead_letters=args.dead_letters,
                              idle_s=_idle_s(args))
    doc = report.to_dict()
    plan = doc["plan"]
    removed = doc["removed"] if not report.dry_run else plan["sink_rows"]
    rows = [{"what": f"rows of table {table}", "count": count} for table, count in sorted(removed.items())]
    if plan["consumer_group"]:
        rows.append({"what": f"consumer group {plan['consumer_group']}",
                     "count": "to delete" if report.dry_run else
                     {None: "not deleted (see the notes)", True: "deleted", False: "none"}[report.group_deleted]})
    sections = [(f"{'to remove' if report.dry_run else 'removed'} of {args.pipeline_id}", rows)]
    recovery = doc["recovery"]
    if recovery and (recovery["branches"] or recovery["batches"]):
        sections.append((IN_DOUBT_TITLE, _branches(recovery["branches"])))
        sections.append(("unfinished batches", [{"batch": b["batch_id"], "state": b["state"],
                                                 "action": b["recover"], "why": b["reason"]}
                                                for b in recovery["batches"]]))
    notes = [*report.plan.notes, *report.notes]
    if report.dry_run:
        if report.refusal:
            notes.append(f"--apply would be refused: {report.refusal}")
        notes.append("dry run: nothing was changed; add --apply --reason TEXT to retire it (its in-doubt work is "
                     "recovered first, as `airflow eo recover` does)")
    elif report.epoch is not None:
        notes.append(f"retired under epoch {report.epoch} (any running attempt is fenced); recorded in the audit "
                     f"log. A run of {args.pipeline_id} is now refused until `airflow eo retire {args.pipeline_id} "
                     "--undo --apply --reason TEXT`")
    _show(args.output, doc, sections, notes)


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation(check=_check_rename_args)
def rename(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo rename OLD NEW [--apply --reason TEXT]``."""
    report = PipelineLifecycle(ops).rename(args.pipeline_id, args.new_pipeline_id, apply=args.apply,
                                           reason=args.reason, idle_s=_idle_s(args))
    doc = report.to_dict()
    rows = [{"table": table, "rows": count} for table, count in sorted(report.sink_rows.items())]
    notes = list(report.notes)
    if report.dry_run:
        if report.refusal:
            notes.append(f"--apply would be refused: {report.refusal}")
        notes.append("dry run: nothing was changed; add --apply --reason TEXT to rename it")
    else:
        notes.append(f"renamed under epoch {report.epoch}; recorded in the audit log. Set the task's pipeline_id= "
                     f"to {report.new!r}: its next batch continues where {report.old!r} stopped")
    _show(args.output, doc, [(f"the sink's rows of {report.old} {'to move' if report.dry_run else 'moved'}", rows)],
          notes)


def _check_seed_args(args: Any) -> None:
    _check_apply(args, "seed")
    parse_offsets(args.to_offsets)


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation(check=_check_seed_args)
def seed(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo seed PIPELINE --to-offsets JSON [--apply --reason TEXT]``."""
    report = PipelineLifecycle(ops).seed(args.pipeline_id, parse_offsets(args.to_offsets), apply=args.apply,
                                         reason=args.reason)
    doc = report.to_dict()
    rows = [{"topic": c.topic, "partition": c.partition, "starts at": c.new} for c in report.plan.changes]
    notes = list(report.notes)
    if report.dry_run:
        if report.refusal:
            notes.append(f"--apply would be refused: {report.refusal}")
        notes.append("dry run: nothing was changed; add --apply --reason TEXT to write the starting offsets")
    else:
        notes.append(f"written under epoch {report.epoch}; recorded in the audit log. Its first run reads from "
                     "these offsets")
    _show(args.output, doc, [(f"starting offsets of {args.pipeline_id}", rows)], notes)


def _retention_s(args: Any) -> float:
    try:
        seconds = parse_duration(args.older_than)
    except OperationError:
        raise OperationError(f"--older-than {args.older_than!r} is not a duration: give seconds or a number with a "
                             "unit s, m, h or d (90d)") from None
    check_retention(seconds)
    return seconds


def _check_prune_args(args: Any) -> None:
    _check_apply(args, "prune")
    _retention_s(args)


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation(check=_check_prune_args)
def prune(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo prune [PIPELINE] --older-than 90d [--apply --reason TEXT]``."""
    report = HistoryPruner(ops).prune(_retention_s(args), pipeline_id=args.pipeline_id, apply=args.apply,
                                      reason=args.reason)
    rows = [{"pipeline": p.pipeline_id, "batches": p.batches, "audit rows": p.audit_rows,
             "dead letters": p.dead_letters,
             "kept from batch": "-" if p.kept_below is None else p.kept_below, "why kept": p.skipped or ""}
            for p in report.pipelines]
    notes = [*report.notes, *(f"{p.pipeline_id}: {note}" for p in report.pipelines for note in p.notes)]
    notes.append(f"history last written before {report.cutoff.isoformat(timespec='seconds')}; the last committed "
                 "batch, unfinished batches and those after them, and batches in-doubt branches name are kept")
    if report.dry_run:
        notes.append("dry run: nothing was changed; add --apply --reason TEXT to remove them")
    else:
        notes.append(f"removed in statements of at most {DEFAULT_CHUNK} rows; each pipeline pruned is recorded in the "
                     "audit log")
    _show(args.output, report.to_dict(), [("to remove" if report.dry_run else "removed", rows)], notes)
