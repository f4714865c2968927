"""``airflow eo verify --all`` and ``airflow eo recover --orphans``: every in-doubt branch of ours on every sink
database the store's pipelines recorded (and every Kafka-sink pipeline's open transaction), attributed to its
pipeline, decided by the store, and ended under the pipeline's epoch.

Separate from a pipeline's own ``recover`` (``repairs.py``) because it works across every pipeline and database
of the store at once (two scans, age thresholds, branches of pipelines the store never knew); an open Kafka
transaction is ended by that pipeline's ``recover``, which it is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from airflow_eo.core.errors import ConfigurationError, OperationError
from airflow_eo.core.orphans import (
    InDoubtServer,
    OpenTransaction,
    OpenTransactionServer,
    Orphan,
    OrphanAction,
    ScannedBranch,
    branch_age,
    decide_open_transaction,
    decide_orphan,
    overdue,
    owner_of,
    pipeline_keys,
    seen_in_both,
)
from airflow_eo.core.pipeline_status import BatchInfo
from airflow_eo.core.recovery import BranchAction
from airflow_eo.core.sink_kinds import capabilities_of
from airflow_eo.ops.context import OperationsContext
from airflow_eo.ops.repairs import PipelineRepairs
from airflow_eo.ops.reports import InDoubtReport, OrphanOutcome, OrphansReport

log = logging.getLogger(__name__)

#: The audit action of ``recover --orphans``.
ORPHANS_ACTION = "recover orphans"


class OrphanRecovery:
    """In-doubt branches and open transactions across every pipeline of the store.

    :param context: the store, the source cluster and the sinks.
    :param repairs: a pipeline's ``recover`` (ends a Kafka-sink pipeline's open transaction).
    :param actor: who runs it (recorded in ``eo_audit``).
    """

    def __init__(self, context: OperationsContext, repairs: PipelineRepairs, actor: str) -> None:
        self.context = context
        self.store = context.store
        self.repairs = repairs
        self.actor = actor

    def in_doubt_everywhere(self, unknown_rollback: bool = False) -> InDoubtReport:
        """Every in-doubt branch carrying our prefix on every database that a pipeline of the store recorded as its
        two-phase sink's (read-only), each attributed to its pipeline (or none) and decided by the store
        (:mod:`airflow_eo.core.orphans`).

        :param unknown_rollback: decide a branch of a pipeline the store never knew as a rollback (else: left).
        """
        servers, unchecked, sink_of = self._in_doubt_servers()
        ids = [p.pipeline_id for p in self.store.pipelines()]
        keys = pipeline_keys(ids)
        scanned: list[tuple[str, str, ScannedBranch]] = []
        databases = []
        for label, (server, _) in sorted(servers.items()):
            try:
                found = server.scan_in_doubt()
            except Exception as exc:
                said = self.context.said(exc, 'in-doubt scan of ' + label)
                unchecked.append(f"{label}: could not be scanned ({said})")
                continue
            databases.append(label)
            scanned.extend((label, server.in_doubt_branch_name(), b) for b in found)
        owners = {b.xid: owner_of(b.xid, keys, ids) for _, _, b in scanned}
        rows = self._batch_rows(owners)
        now = datetime.now(timezone.utc)
        orphans = []
        for label, name, b in scanned:
            pipeline = owners[b.xid]
            row = rows.get((pipeline, b.xid.batch_id)) if pipeline is not None else None
            action, reason = decide_orphan(b.xid, pipeline, row.record if row else None, unknown_rollback,
                                           sink_of.get(pipeline) if pipeline is not None else None, label)
            age = branch_age(b.prepared_at, b.xid.epoch, row.record.epoch if row else None,
                             row.created_at if row else None, row.updated_at if row else None, now)
            orphans.append(Orphan(label, name, b.xid, pipeline, age, b.locks, action, reason))
        transactions = self._open_transactions(databases, unchecked, now)
        return InDoubtReport(orphans, databases, unchecked, transactions)

    def _open_transactions(self, databases: list[str], unchecked: list[str],
                           now: datetime) -> list[OpenTransaction]:
        """The open transactions on every Kafka-sink pipeline's output topic, each with the pipeline's unfinished
        batch and what ``recover`` does (:func:`~airflow_eo.core.orphans.decide_open_transaction`)."""
        found: list[OpenTransaction] = []
        for info in self.store.pipelines():
            capabilities = capabilities_of(info.sink)
            if info.sink is None or capabilities is None or not capabilities.consumer_group:
                continue
            try:
                sink = self.context.connections.sink(info.pipeline_id, info.sink)
                if not isinstance(sink, OpenTransactionServer):
                    continue
                label = sink.in_doubt_server()
                open_ones = sink.open_transactions()
                unfinished = self.store.unfinished_batches(info.pipeline_id) if open_ones else []
                committed = sink.committed_batches(unfinished) if unfinished else set()
            except Exception as exc:
                unchecked.append(f"Kafka sink of {info.pipeline_id}: could not be read "
                                 f"({self.context.said(exc, 'open transactions of ' + info.pipeline_id)})")
                continue
            if label not in databases:
                databases.append(label)
            if not open_ones:
                continue
            batch_id, action, reason = decide_open_transaction(unfinished, committed)
            row = self.store.batch_history(info.pipeline_id, 1, [batch_id]) if batch_id is not None else []
            age = branch_age(None, row[0].record.epoch, row[0].record.epoch, row[0].created_at, row[0].updated_at,
                             now) if row else None
            found.extend(OpenTransaction(label, info.pipeline_id, sink.transactional_id(), topic, partition, stable,
                                         end, batch_id, age, action, reason)
                         for (topic, partition), (stable, end) in sorted(open_ones.items()))
        return found

    def recover_orphans(self, apply: bool = False, reason: str | None = None, unknown_rollback: bool = False,
                        older_than_s: float = 600.0, scan_interval_s: float = 5.0) -> OrphansReport:
        """Resolve every in-doubt branch of ours left on the store's sink databases (``apply``), or show what that
        would do (the default).

        Two scans ``scan_interval_s`` apart: a branch only one lists, or not older than ``older_than_s``, is
        skipped (in flight: its attempt commits or rolls it back). For each pipeline with branches to act on, its
        epoch is taken with an audit row (fencing any attempt that could still commit the batch), its batch rows are
        read again and decide each branch (:func:`~airflow_eo.core.orphans.decide_orphan`); the audit row then
        records what was done. A branch of a pipeline the store never knew is left unless ``unknown_rollback``
        (then rolled back, with an audit row under its key).
        """
        if apply and not (reason or "").strip():
            raise OperationError("recover --orphans --apply needs --reason TEXT (recorded in the audit log)")
        first = self.in_doubt_everywhere(unknown_rollback)
        time.sleep(scan_interval_s)
        second = self.in_doubt_everywhere(unknown_rollback)
        both = seen_in_both(((o.database, o.xid) for o in first.orphans),
                            ((o.database, o.xid) for o in second.orphans))
        old = {(o.database, o.xid) for o in overdue(second.orphans, older_than_s)}
        outcomes: list[OrphanOutcome] = []
        act: list[Orphan] = []
        for o in second.orphans:
            key = (o.database, o.xid)
            if key not in both:
                outcomes.append(OrphanOutcome(o, f"skipped: listed by one scan of two {scan_interval_s:g}s apart "
                                                 "(in flight)"))
            elif key not in old:
                outcomes.append(OrphanOutcome(o, f"skipped: not older than {older_than_s:g}s"))
            elif o.action is OrphanAction.LEAVE:
                outcomes.append(OrphanOutcome(o, "left"))
            elif not apply:
                outcomes.append(OrphanOutcome(o, f"would {o.action.value}"))
            else:
                act.append(o)
        unchecked = sorted(set(first.unchecked) | set(second.unchecked))
        outcomes.extend(self._end_open_transactions(first, second, apply, reason, older_than_s, scan_interval_s))
        if not act:
            return OrphansReport(not apply, outcomes, second.databases, unchecked)
        assert reason is not None
        servers, _, sink_of = self._in_doubt_servers()
        by_pipeline: dict[str | None, list[Orphan]] = {}
        for o in act:
            by_pipeline.setdefault(o.pipeline_id, []).append(o)
        for pipeline, orphans in sorted(by_pipeline.items(), key=lambda kv: kv[0] or ""):
            if pipeline is None:
                outcomes.extend(self._end_unknown(o, servers, reason.strip()) for o in orphans)
            else:
                outcomes.extend(self._end_fenced(pipeline, orphans, servers, sink_of, reason.strip()))
        return OrphansReport(False, outcomes, second.databases, unchecked)

    def _end_open_transactions(self, first: InDoubtReport, second: InDoubtReport, apply: bool, reason: str | None,
                               older_than_s: float, scan_interval_s: float) -> list[OrphanOutcome]:
        """A Kafka-sink pipeline's open transactions both scans list and older than the threshold: the pipeline's
        ``recover`` (its epoch taken, audited; ``init_transactions`` aborts its producer's open transaction, a
        batch Kafka committed is rolled forward), once per pipeline."""
        both = seen_in_both((t.key for t in first.transactions), (t.key for t in second.transactions))
        old = {t.key for t in overdue(second.transactions, older_than_s)}
        outcomes = []
        recovered: dict[str, int | None] = {}
        for t in second.transactions:
            if t.key not in both:
                outcomes.append(OrphanOutcome(t, f"skipped: listed by one scan of two {scan_interval_s:g}s apart "
                                                 "(in flight)"))
            elif t.key not in old:
                outcomes.append(OrphanOutcome(t, f"skipped: not older than {older_than_s:g}s"))
            elif not apply:
                outcomes.append(OrphanOutcome(t, f"would recover {t.pipeline_id} ({t.action})"))
            else:
                assert reason is not None
                if t.pipeline_id not in recovered:
                    recovered[t.pipeline_id] = self.repairs.recover(t.pipeline_id, apply=True,
                                                                    reason=reason.strip()).epoch
                epoch = recovered[t.pipeline_id]
                outcomes.append(OrphanOutcome(t, f"recovered ({t.action})" if epoch is not None else
                                              "left: the pipeline has nothing to recover (Kafka aborts it after "
                                              "transaction.timeout.ms)", epoch))
        return outcomes

    def _end_fenced(self, pipeline_id: str, orphans: list[Orphan], servers: Mapping[str, tuple[InDoubtServer, Any]],
                    sink_of: Mapping[str, str], reason: str) -> list[OrphanOutcome]:
        """Take the pipeline's epoch (audited), decide its branches again by its batch rows as they are now (no
        attempt of an earlier epoch can commit a batch any more), end them, complete the audit row."""
        plan = [{**o.to_dict(), "outcome": f"will {o.action.value}"} for o in orphans]
        epoch = self.store.take_audited(pipeline_id, self.actor, ORPHANS_ACTION, reason,
                                        {"branches": plan, "completed": False})
        log.info("pipeline %s taken with epoch %d to resolve %d in-doubt branches", pipeline_id, epoch, len(orphans))
        ids = sorted({o.xid.batch_id for o in orphans})
        rows = {b.record.batch_id: b.record for b in self.store.batch_history(pipeline_id, len(ids), ids)}
        done = []
        for o in orphans:
            action, why = decide_orphan(o.xid, pipeline_id, rows.get(o.xid.batch_id), sink_database=sink_of.get(
                pipeline_id), found_on=o.database)
            decided = replace(o, action=action, reason=why)
            done.append(OrphanOutcome(decided, self._end(decided, servers), epoch))
        self.store.complete_audit(pipeline_id, epoch, ORPHANS_ACTION,
                                  {"branches": [d.to_dict() for d in done], "completed": True})
        return done

    def _end_unknown(self, orphan: Orphan, servers: Mapping[str, tuple[InDoubtServer, Any]],
                     reason: str) -> OrphanOutcome:
        """Roll back a branch no pipeline of the store owns (asked for), on record under its key."""
        outcome = OrphanOutcome(orphan, self._end(orphan, servers))
        self.store.record_audit(f"eo:{orphan.xid.pipeline_key}", self.actor, ORPHANS_ACTION, reason,
                                {"branches": [outcome.to_dict()], "completed": True})
        return outcome

    def _end(self, orphan: Orphan, servers: Mapping[str, tuple[InDoubtServer, Any]]) -> str:
        if orphan.action is OrphanAction.LEAVE:
            return "left"
        server = servers[orphan.database][0]
        action = BranchAction(orphan.action.value)
        ended = server.end_branch(orphan.xid, action)
        log.warning("in-doubt %s %s of %s on %s: %s (%s)", orphan.branch, orphan.xid.encode(), orphan.pipeline,
                    orphan.database, action.value if ended else "already ended", orphan.reason)
        if not ended:
            return "already ended"
        return "committed" if action is BranchAction.COMMIT else "rolled back"

    def _in_doubt_servers(self) -> tuple[dict[str, tuple[InDoubtServer, set[str]]], list[str], dict[str, str]]:
        """The databases the store's pipelines recorded as their two-phase sinks' (label -> the adapter that reads
        it, the connection ids reaching it), one per server (two connections to one server are one database); the
        sinks whose database could not be reached, and why; and each pipeline's database (pipeline id -> label)."""
        by_server: dict[str, tuple[InDoubtServer, set[str]]] = {}
        unchecked: list[str] = []
        built: dict[tuple[str, str | None], str | None] = {}
        sink_of: dict[str, str] = {}
        for info in self.store.pipelines():
            capabilities = capabilities_of(info.sink)
            if info.sink is None or capabilities is None or not capabilities.in_doubt_branches:
                continue
            where = (info.sink.kind, info.sink.conn_id)
            if where not in built:
                built[where] = None
                try:
                    sink = self.context.connections.sink(info.pipeline_id, info.sink)
                except Exception as exc:
                    reason = "could not be built" if isinstance(exc, ConfigurationError) else "could not be reached"
                    unchecked.append(f"{info.sink.kind} on connection {info.sink.conn_id}: {reason} "
                                     f"({self.context.said(exc, 'sink of ' + info.pipeline_id)})")
                    continue
                if not isinstance(sink, InDoubtServer):
                    continue
                built[where] = server = sink.in_doubt_server()
                by_server.setdefault(server, (sink, set()))[1].add(str(info.sink.conn_id))
            # A pipeline whose database could not be read: none of its branches elsewhere is decided (which store's?)
            sink_of[info.pipeline_id] = built[where] or f"connection {info.sink.conn_id} (not reachable)"
        return by_server, unchecked, sink_of

    def _batch_rows(self, owners: Mapping[Any, str | None]) -> dict[tuple[str, int], BatchInfo]:
        """The batch rows the branches name, per (pipeline, batch id)."""
        wanted: dict[str, set[int]] = {}
        for xid, pipeline in owners.items():
            if pipeline is not None:
                wanted.setdefault(pipeline, set()).add(xid.batch_id)
        rows = {}
        for pipeline, ids in wanted.items():
            for b in self.store.batch_history(pipeline, len(ids), sorted(ids)):
                rows[(pipeline, b.record.batch_id)] = b
        return rows

