"""``airflow eo`` commands: arguments in, :class:`~airflow_eo.ops.service.PipelineOperations` call, output out.

Tables for people (``--output table``, the default, or ``plain``), one JSON/YAML document for scripts
(``--output json|yaml``), as Airflow's own commands print them (``AirflowConsole``). A command that
fails exits non-zero with the reason on stderr and has changed nothing.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from airflow.cli.simple_table import AirflowConsole
from airflow.utils.cli import suppress_logs_and_warning
from airflow.utils.providers_configuration_loader import providers_configuration_loaded
from rich.markup import escape

from airflow_eo.cli.arguments import parse_offsets
from airflow_eo.cli.definition import DOUBLE_COUNT_FLAG
from airflow_eo.core.drivers import describe_driver_error
from airflow_eo.core.errors import AirflowEoError, OperationError, UnknownPipelineError
from airflow_eo.core.orphans import parse_duration
from airflow_eo.core.rewind import RewindKind, RewindTarget
from airflow_eo.hooks.operations import default_offset_store_conn_id, locate_pipeline, pipeline_operations
from airflow_eo.hooks.stats import emit_in_doubt_gauges
from airflow_eo.ops.reports import audit_dict, batch_dict
from airflow_eo.ops.service import PipelineOperations

F = TypeVar("F", bound=Callable[..., Any])
Rows = list[dict[str, Any]]

#: Both two-phase sinks leave these: MySQL's XA branches, PostgreSQL's prepared transactions.
IN_DOUBT_TITLE = "in-doubt branches (XA branches, PostgreSQL prepared transactions)"


def _operation(check: Callable[[Any], None] | None = None) -> Callable[[F], F]:
    """Run a command with the operations of the connections it was given, after ``check`` of its arguments
    (bad arguments fail before anything is connected); known failures become a clear message and a non-zero
    exit (``SystemExit``), not a traceback."""

    def decorate(func: F) -> F:
        command = f"airflow eo {func.__name__.replace('_', '-')}"

        @functools.wraps(func)
        def wrapper(args: Any) -> None:
            from airflow.exceptions import AirflowNotFoundException

            # An admin command of Airflow's own CLI: connections come from the metadata database too (and env
            # vars, secrets backends), as for `airflow connections get`, which sets the same server context.
            os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "server"
            try:
                if check is not None:
                    check(args)
                ops = pipeline_operations(args.offset_store_conn_id, args.kafka_conn_id, args.sink_conn_id,
                                          mysql_conn_id=args.mysql_conn_id)
                try:
                    func(args, ops)
                except UnknownPipelineError as unknown:
                    if args.offset_store_conn_id or not getattr(args, "pipeline_id", None):
                        raise
                    # Not in the default store: the pipeline's may be another (its operator's offset_store_conn_id).
                    store = _locate_store(args.pipeline_id, default_offset_store_conn_id(), unknown)
                    print(f"{command}: pipeline {args.pipeline_id!r} is in the offset store of connection {store!r} "
                          "(found among the mysql / postgres connections; --offset-store-conn-id names it)",
                          file=sys.stderr)
                    func(args, pipeline_operations(store, args.kafka_conn_id, args.sink_conn_id,
                                                   mysql_conn_id=args.mysql_conn_id))
            except (AirflowEoError, AirflowNotFoundException) as exc:
                raise SystemExit(f"{command}: {exc}") from None
            except Exception as exc:
                # A database's or Kafka's error, from any driver a room declared (core/drivers.py): one line.
                described = describe_driver_error(exc)
                if described is None:
                    raise
                raise SystemExit(f"{command}: {described}") from None

        return wrapper  # type: ignore[return-value]

    return decorate


def _locate_store(pipeline_id: str, default_store: str, unknown: UnknownPipelineError) -> str:
    """The one other offset store holding the pipeline (:func:`~airflow_eo.hooks.operations.locate_pipeline`), or an
    error saying which connection to name."""
    found, checked = locate_pipeline(pipeline_id, default_store)
    if len(found) == 1:
        return found[0]
    if found:
        raise OperationError(f"pipeline {pipeline_id!r} is not in the default offset store ({default_store!r}) but in "
                             f"the stores of several connections: {', '.join(found)}; name one with "
                             "--offset-store-conn-id")
    looked = f"the other mysql / postgres connections ({', '.join(checked)})" if checked else "no other connection"
    raise OperationError(f"{unknown}; nor is it in {looked}: name its store's connection with --offset-store-conn-id "
                         "(the operator's offset_store_conn_id; a connection kept in a secrets backend cannot be "
                         "listed, so name it)")


# --------------------------------------------------------------------------- arguments


def _check_apply(args: Any, what: str) -> None:
    if args.apply and args.dry_run:
        raise OperationError(f"--apply and --dry-run contradict each other ({what} is a dry run unless --apply)")
    if args.apply and not (args.reason or "").strip():
        raise OperationError("--apply needs --reason TEXT (recorded in the audit log)")


def _check_rewind_args(args: Any) -> None:
    _rewind_target(args)
    _check_apply(args, "a rewind")


def _check_recover_args(args: Any) -> None:
    _check_apply(args, "recover")
    _check_one_or_all(args, "--orphans", getattr(args, "orphans", False))
    if not getattr(args, "orphans", False):
        given = [flag for flag, value in (("--unknown", args.unknown), ("--older-than", args.older_than)) if value]
        if given:
            raise OperationError(f"{', '.join(given)} go(es) with --orphans only")
    parse_duration(args.older_than or "10m")


def _check_verify_args(args: Any) -> None:
    _check_one_or_all(args, "--all", getattr(args, "all", False))
    if args.older_than is not None and not args.all:
        raise OperationError("--older-than goes with --all only")
    parse_duration(args.older_than or "10m")


def _check_one_or_all(args: Any, flag: str, every: bool) -> None:
    if bool(args.pipeline_id) == bool(every):
        raise OperationError(f"name a pipeline or give {flag} (every pipeline's in-doubt work), not "
                             + ("both" if every else "neither"))


def _rewind_target(args: Any) -> RewindTarget:
    given = [name for name, value in (("--to-earliest", args.to_earliest), ("--to-latest", args.to_latest),
                                      ("--to-datetime", args.to_datetime), ("--to-offsets", args.to_offsets))
             if value]
    if len(given) != 1:
        raise OperationError("give exactly one of --to-earliest, --to-latest, --to-datetime TIME, --to-offsets JSON"
                             + (f" (got {', '.join(given)})" if given else ""))
    if args.to_earliest:
        return RewindTarget(RewindKind.EARLIEST)
    if args.to_latest:
        return RewindTarget(RewindKind.LATEST)
    if args.to_offsets:
        return RewindTarget(RewindKind.OFFSETS, offsets=parse_offsets(args.to_offsets))
    try:
        at = datetime.fromisoformat(args.to_datetime)
    except ValueError:
        raise OperationError(f"--to-datetime {args.to_datetime!r} is not an ISO 8601 time, e.g. "
                             "2026-11-20T08:00:00+00:00") from None
    return RewindTarget(RewindKind.DATETIME, at=at if at.tzinfo else at.replace(tzinfo=timezone.utc))


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation()
def pipelines(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo pipelines``."""
    found = [p.to_dict() for p in ops.pipelines()]
    rows = [{"pipeline": p["pipeline_id"], "owner": p["owner"], "mode": p["mode"], "epoch": p["epoch"],
             "sink": p["sink"], "last batch": p["last_batch_id"], "state": p["last_state"],
             "when (UTC)": _when(p["last_at"]), "lag": "-" if p["mode"] == "interval" else _unknown(p["lag"])}
            for p in found]
    _show(args.output, found, [("pipelines", rows)])


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation()
def status(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo status PIPELINE``."""
    found = ops.status(args.pipeline_id)
    doc = found.to_dict()
    head = [{"pipeline": doc["pipeline_id"], "owner": doc["owner"], "mode": doc["mode"], "epoch": doc["epoch"],
             "sink": _sink(doc["sink"]), "lag": _unknown(doc["lag"])}]
    partitions = [{"topic": p["topic"], "partition": p["partition"], "committed": _unknown(p["committed"], "-"),
                   "last stable": _unknown(p["last_stable"]), "log start": _unknown(p["log_start"]),
                   "lag": _unknown(p["lag"]), **({"lost": p["lost"]} if p["lost"] else {})}
                  for p in doc["partitions"]]
    unfinished = [{"batch": u["batch_id"], "run": u["run_id"], "state": u["state"], "epoch": u["epoch"],
                   "ranges": _ranges(u["ranges"]), "since (UTC)": _when(u["updated_at"]),
                   "recover would": u["recover"], "why": u["reason"]} for u in doc["unfinished"]]
    notes = list(doc["notes"])
    if doc["unfinished"]:
        notes.append("a retry of the batch's own run resumes it; any other run (or `airflow eo recover`) aborts "
                     "or rolls it forward as shown. It may belong to an attempt that is running right now.")
    if doc["in_doubt"]:
        notes.append(f"in-doubt branches hold row locks until resolved: let the next run resolve them, or now: "
                     f"airflow eo recover {args.pipeline_id} (a dry run), then with --apply --reason TEXT")
    _show(args.output, doc, [("pipeline", head), ("partitions", partitions), ("unfinished batch", unfinished),
                             (IN_DOUBT_TITLE, _branches(doc["in_doubt"]))], notes)


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation()
def history(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo history PIPELINE [--limit N]``."""
    found = ops.history(args.pipeline_id, args.limit)
    batches = [batch_dict(b) for b in found.batches]
    audit = [audit_dict(a) for a in found.audit]
    batch_rows = [{"batch": b["batch_id"], "run": b["run_id"], "state": b["state"],
                   **({"interval": b["interval"]} if b["interval"] else {}), "ranges": _ranges(b["ranges"]),
                   "in": _unknown(b["records_in"], "-"), "out": _unknown(b["rows_out"], "-"),
                   "dead": _unknown(b["dead_letters"], "-"), "dup": _unknown(b["duplicates"], "-"),
                   "seconds": " ".join(f"{k}={v:g}" for k, v in b["seconds"].items()),
                   "skipped (lost)": _ranges(b["skipped"]) or "-", "notes": _flags(b),
                   "at (UTC)": _when(b["committed_at"] or b["created_at"])} for b in batches]
    audit_rows = [{"at (UTC)": _when(a["at"]), "who": a["actor"], "action": a["action"], "epoch": a["epoch"],
                   "reason": a["reason"] or "", "change": "; ".join(a["changes"])} for a in audit]
    _show(args.output, found.to_dict(), [("batches (newest first)", batch_rows), ("audit log", audit_rows)])


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation(check=_check_recover_args)
def recover(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo recover PIPELINE [--apply --reason TEXT]``, ``airflow eo recover --orphans [...]``."""
    if args.orphans:
        _recover_orphans(args, ops)
        return
    report = ops.recover(args.pipeline_id, apply=args.apply, reason=args.reason)
    doc = report.to_dict()
    batches = [{"batch": b["batch_id"], "run": b["run_id"], "state": b["state"], "action": b["recover"],
                "why": b["reason"]} for b in doc["batches"]]
    if report.dry_run:
        notes = ["dry run: nothing was changed; add --apply --reason TEXT to do it (it takes the pipeline's epoch, "
                 "fencing any running attempt)"]
    elif report.epoch is None:
        notes = ["nothing to recover: no in-doubt branch, no unfinished batch; nothing was changed"]
    else:
        notes = [f"done under epoch {report.epoch} (any running attempt is fenced); recorded in the audit log"]
    _show(args.output, doc, [(IN_DOUBT_TITLE, _branches(doc["branches"])), ("unfinished batches", batches)],
          notes)
    if report.left:
        raise SystemExit(f"airflow eo recover: branches still in doubt after recovery (prepared meanwhile by a "
                         f"fenced attempt's Spark task?): {', '.join(report.left)}; run it again")


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation(check=_check_rewind_args)
def rewind(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo rewind PIPELINE --to-... [--apply --reason TEXT]``."""
    target = _rewind_target(args)
    report = ops.rewind(args.pipeline_id, target, apply=args.apply, reason=args.reason,
                        allow_double_count=args.allow_double_count)
    doc = report.to_dict()
    rows = [{"topic": c["topic"], "partition": c["partition"], "old": _unknown(c["old"], "-"), "new": c["new"],
             "reprocessed": c["reprocessed"], "skipped": c["skipped"]} for c in doc["partitions"]]
    notes = list(report.notes)
    notes.append(f"in total {doc['reprocessed']} offsets will be reprocessed and {doc['skipped']} skipped by the "
                 "next run (offsets: an upper bound of records)" if not report.applied else
                 f"applied under epoch {report.epoch} (any running attempt is fenced); recorded in the audit log: "
                 f"the next run reprocesses {doc['reprocessed']} and skips {doc['skipped']} offsets")
    if not args.apply:
        if report.refusal:
            notes.append(f"--apply would be refused: {report.refusal}")
        notes.append("dry run: nothing was changed; add --apply --reason TEXT to move the offsets")
    _show(args.output, doc, [(f"rewind of {args.pipeline_id} to {doc['target']}", rows)], notes)


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation()
def dead_letters(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo dead-letters PIPELINE [--batch N]``."""
    found = ops.dead_letters(args.pipeline_id, args.batch, args.limit)
    rows = [{"batch": d["batch_id"], "topic": d["topic"], "partition": d["partition"], "offset": d["offset"],
             "key": _cut(d["key"], 30), "value": _cut(d["value"], 60),
             "headers": _cut(None if d["headers"] is None else
                             ", ".join(f"{h['key']}={h['value'] if h['value'] is not None else 'null'}"
                                       for h in d["headers"]), 40),
             "error": _cut(d["error"], 80),
             "at (UTC)": _when(d["created_at"])} for d in found]
    _show(args.output, found, [("dead letters", rows)])


@suppress_logs_and_warning
@providers_configuration_loaded
@_operation(check=_check_verify_args)
def verify(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo verify PIPELINE``: one line per finding; exit code 1 with findings, 2 when nothing was found but
    a check could not run, else 0. ``airflow eo verify --all``: every in-doubt branch of ours."""
    if args.all:
        _verify_all(args, ops)
        return
    report = ops.verify(args.pipeline_id)
    if args.output in ("json", "yaml"):
        _show(args.output, report.to_dict(), [])
    else:
        console = AirflowConsole()
        for finding in report.findings:
            console.print(escape(visible(str(finding))), soft_wrap=True)
        for check in report.checked:
            console.print(escape(visible(f"checked: {check}")), soft_wrap=True)
        for check in report.unchecked:
            console.print(escape(visible(f"not checked: {check}")), soft_wrap=True)
    if report.findings:
        raise SystemExit(f"airflow eo verify: {len(report.findings)} finding(s) for pipeline {args.pipeline_id}")
    if report.unchecked:  # exit code 2, as the help says: a message alone would make SystemExit's code 1
        print(f"airflow eo verify: no finding, but {len(report.unchecked)} check(s) could not run", file=sys.stderr)
        raise SystemExit(2)


def _in_doubt_rows(branches: Rows, verb: str) -> Rows:
    return [{"database": b["database"], "pipeline": b["pipeline"], "batch": b["batch_id"], "xid": b["xid"],
             "age": _age(b["age_seconds"]),
             "locks": "not said" if b["locks"] is None else (", ".join(b["locks"]) or "none"),
             verb: b.get("outcome", b["action"]), "why": b["reason"]} for b in branches]


def _verify_all(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo verify --all [--older-than 10m]``: exit code 1 when a branch is older than the threshold."""
    older_than = parse_duration(args.older_than or "10m")
    report = ops.in_doubt_everywhere()
    emit_in_doubt_gauges(report.oldest_age_seconds())
    doc = report.to_dict(older_than)
    notes = [f"scanned: {d}" for d in report.databases] + [f"not scanned: {u}" for u in report.unchecked]
    old = doc["overdue"]
    shown = [b for b in doc["in_doubt"] if older_than <= 0 or b["xid"] in old]
    notes.append(f"{len(old)} of {len(doc['in_doubt'])} in-doubt branch(es) older than {older_than:g}s"
                 + (" (shown)" if older_than > 0 else ""))
    _show(args.output, doc, [(IN_DOUBT_TITLE + ", every pipeline", _in_doubt_rows(shown, "recover will"))], notes)
    if old:
        raise SystemExit(f"airflow eo verify --all: {len(old)} in-doubt branch(es) older than {older_than:g}s: "
                         "`airflow eo recover --orphans` resolves them")
    if report.unchecked:
        print(f"airflow eo verify --all: {len(report.unchecked)} database(s) could not be scanned", file=sys.stderr)
        raise SystemExit(2)


def _recover_orphans(args: Any, ops: PipelineOperations) -> None:
    """``airflow eo recover --orphans [--apply --reason TEXT] [--unknown rollback] [--older-than 10m]``."""
    report = ops.recover_orphans(apply=args.apply, reason=args.reason, unknown_rollback=args.unknown == "rollback",
                                 older_than_s=parse_duration(args.older_than or "10m"),
                                 scan_interval_s=args.scan_interval)
    doc = report.to_dict()
    notes = [f"scanned: {d}" for d in report.databases] + [f"not scanned: {u}" for u in report.unchecked]
    if report.dry_run:
        notes.append("dry run: nothing was changed; add --apply --reason TEXT to do it (it takes each pipeline's "
                     "epoch, fencing any running attempt, and records it in the audit log)")
    else:
        notes.append("done under each pipeline's newly taken epoch (shown per branch); recorded in the audit log")
    _show(args.output, doc, [(IN_DOUBT_TITLE + ", every pipeline", _in_doubt_rows(doc["branches"], "outcome"))],
          notes)


# --------------------------------------------------------------------------- output


def _show(output: str, document: Any, sections: Sequence[tuple[str, Rows]], notes: Sequence[str] = ()) -> None:
    """JSON/YAML: the whole document; table/plain: each section as a table, then the notes."""
    console = AirflowConsole()
    if output == "json":
        console.print_as_json(document)
        return
    if output == "yaml":
        console.print_as_yaml(document)
        return
    for title, rows in sections:
        console.print(escape(visible(title)), style="bold")
        if rows:
            # Cells are data, not rich markup (a pipeline id or an error may hold brackets), nor terminal controls.
            shown = [{k: visible(str(v)) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
            console.print_as([{k: escape(str(v)) for k, v in r.items()} for r in shown] if output == "table" else shown,
                             output)
        else:
            console.print("  (none)")
    for note in notes:
        console.print(escape(visible(f"note: {note}")), soft_wrap=True)


# C0 and C1 controls, DEL, and the bidirectional overrides and isolates: a record's bytes (a dead letter's key,
# value, topic or error) may carry terminal escapes (OSC 52 writes the clipboard, CSI moves the cursor) or text
# that reads in another order than it is stored.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``, ``\\u202e``): printed, it can
    only be read, never obeyed by the terminal. JSON and YAML output escape them already."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                         else f"\\u{ord(m.group()):04x}", text)


def _branches(branches: Rows) -> Rows:
    return [{"xid": b["xid"], "batch": b["batch_id"], "epoch": b["epoch"], "age": _age(b["age_seconds"]),
             "recover will": b["action"], "why": b["reason"]} for b in branches]


def _sink(sink: Mapping[str, Any] | None) -> str:
    if not sink:
        return "unknown"
    return f"{sink['kind']} {sink['target']}" + (" (accumulating)" if sink["accumulating"] else "")


def _ranges(ranges: Rows) -> str:
    return ", ".join(f"{r['topic']}[{r['partition']}] {r['from_offset']}..{r['until_offset']}" for r in ranges)


def _flags(batch: Mapping[str, Any]) -> str:
    return ", ".join(name.replace("_", " ") for name in ("resumed", "replayed", "rolled_forward") if batch[name])


def _when(iso: str | None) -> str:
    return "-" if not iso else iso.replace("T", " ")[:23]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m {whole % 60}s"
    return f"{whole // 3600}h {whole % 3600 // 60}m"


def _unknown(value: Any, placeholder: str = "?") -> Any:
    return placeholder if value is None else value


def _cut(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["DOUBLE_COUNT_FLAG", "dead_letters", "history", "pipelines", "recover", "rewind", "status", "verify"]
