"""``airflow eo verify``: whether a pipeline's offset store, its consumer group, its sink and Airflow agree.

Each check is a plain function over what the operations read (:mod:`airflow_eo.ops.verification` does the I/O) and
returns its findings, one per thing that disagrees, each saying what is wrong and what it means:

- :func:`check_tiling`: the committed batches tile every partition with no gap and no overlap, except what an
  audited rewind moved (``airflow eo rewind``) and what a batch skipped on purpose (records lost to retention,
  recorded in its row); the last batch ends where the store's committed offset is.
- :func:`check_mirror`: the consumer group ``airflow_eo.<pipeline_id>`` holds the store's committed offsets.
- :func:`check_branches`, :func:`check_sink_commits`: no prepared branch (XA, PostgreSQL prepared transaction) of a
  batch that is over is still open; no Kafka transaction committed a batch the store has not recorded.
- :func:`check_runs`: every run whose task succeeded has its committed batch, and every committed batch belongs to a
  run (or to an audited recovery, which rolls forward batches of runs that died).

No I/O here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import UNFINISHED, BatchState
from airflow_eo.core.history import PRUNE_ACTION, positions_from_json
from airflow_eo.core.pipeline_status import AuditEntry
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange, TopicPartition, batch_starts
from airflow_eo.core.recovery import BranchAction, decide_branch
from airflow_eo.core.xid import Xid


class Check(str, Enum):
    TILING = "tiling"
    MIRROR = "mirror"
    IN_DOUBT = "in-doubt"
    RUNS = "runs"


@dataclass(frozen=True)
class Finding:
    """One disagreement: which check found it, about what (a partition, a batch, a branch, a run), and what it is."""

    check: Check
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.check.value}: {self.subject}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check.value, "subject": self.subject, "message": self.message}


def _tp(key: TopicPartition) -> str:
    return f"{key[0]}[{key[1]}]"


# --------------------------------------------------------------------------- what people did


@dataclass(frozen=True)
class RewindMove:
    """One partition's committed offset moved by an audited rewind (``old`` None: the partition had none)."""

    key: TopicPartition
    old: int | None
    new: int
    audit_id: int


def audited_moves(audit: Iterable[AuditEntry]) -> list[RewindMove]:
    """Every partition an audited rewind moved, oldest first; and every partition a ``prune`` left somewhere (the
    batches that read it are gone: its committed offset is explained by where they left it, and the first kept batch
    has no predecessor to tile with)."""
    moves: list[RewindMove] = []
    for entry in sorted(audit, key=lambda e: e.audit_id):
        if entry.action == PRUNE_ACTION:  # where the pruned batches left each partition: not a gap, not unexplained
            moves.extend(RewindMove(key, None, offset, entry.audit_id)
                         for key, offset in positions_from_json(entry.details.get("positions", [])).items())
            continue
        if entry.action != "rewind":
            continue
        for p in entry.details.get("partitions", []):
            if p.get("old") != p.get("new"):
                moves.append(RewindMove((p["topic"], int(p["partition"])), p.get("old"), int(p["new"]),
                                        entry.audit_id))
    return moves


def audited_batches(audit: Iterable[AuditEntry]) -> set[int]:
    """The batches an audited (completed) recovery rolled forward: committed by ``airflow eo recover``, not by a run
    (the run that planned them died after its sink's commit point)."""
    found: set[int] = set()
    for entry in audit:
        if entry.action == "recover" and entry.details.get("completed") is not False:
            found.update(int(b["batch_id"]) for b in entry.details.get("batches", [])
                         if b.get("recover") == "roll forward")
    return found


# --------------------------------------------------------------------------- (a) the batches tile the topic


def check_tiling(batches: Sequence[BatchRecord], committed: Mapping[TopicPartition, int],
                 moves: Sequence[RewindMove]) -> list[Finding]:
    """Continuous mode: in batch order, each committed batch takes over each partition exactly where the previous
    one left it (its skipped range, records lost to retention, counts as taken over), or where audited rewinds
    moved it from there; after the last batch (and the rewinds since), the store's committed offset.

    :param batches: the pipeline's batches, any state (only committed ones count).
    :param committed: the store's committed offsets.
    :param moves: the audited rewinds' moves (:func:`audited_moves`), oldest first.
    """
    pending: dict[TopicPartition, list[RewindMove]] = {}
    for move in moves:
        pending.setdefault(move.key, []).append(move)
    findings: list[Finding] = []
    position: dict[TopicPartition, tuple[int, int]] = {}  # partition -> (where the last batch left it, that batch)

    def moved_to(key: TopicPartition, start: int, wanted: int) -> int:
        """Where the audited rewinds that start at ``start`` lead, following them while they do not reach
        ``wanted`` (each rewind counts once)."""
        queue = pending.get(key, [])
        while start != wanted:
            following = next((m for m in queue if m.old == start), None)
            if following is None:
                break
            queue.remove(following)
            start = following.new
        return start

    for batch in sorted((b for b in batches if b.state is BatchState.COMMITTED), key=lambda b: b.batch_id):
        starts = batch_starts(batch.ranges, batch.skipped)
        for r in sorted(batch.ranges):
            key, start = r.key, starts[r.key]
            if key in position:
                left, previous = position[key]
                expected = moved_to(key, left, start)
                if start > expected:
                    findings.append(Finding(Check.TILING, _tp(key), (
                        f"gap: offsets {expected}..{start} were processed by no batch (batch {previous} ended at "
                        f"{left}, batch {batch.batch_id} starts at {start}) and no audited rewind or skip explains "
                        "it")))
                elif start < expected:
                    findings.append(Finding(Check.TILING, _tp(key), (
                        f"overlap: offsets {start}..{expected} were processed twice (batch {previous} ended at "
                        f"{left}, batch {batch.batch_id} starts at {start}) and no audited rewind explains it")))
            position[key] = (r.until_offset, batch.batch_id)
    for key in sorted(set(committed) | set(position)):
        at = committed.get(key)
        if key not in position:
            if at is not None and not any(m.key == key and m.new == at for m in moves):
                findings.append(Finding(Check.TILING, _tp(key), (
                    f"the store's committed offset is {at} but no committed batch read this partition and no "
                    "audited rewind set it")))
            continue
        left, last = position[key]
        if at is None:
            findings.append(Finding(Check.TILING, _tp(key), (
                f"batch {last} committed up to {left} but the store has no committed offset for the partition")))
        elif moved_to(key, left, at) != at:
            findings.append(Finding(Check.TILING, _tp(key), (
                f"the store's committed offset is {at} but the last batch that read the partition ({last}) ended "
                f"at {left}, and no audited rewind moved it there")))
    return findings


def check_interval_tiling(batches: Sequence[BatchRecord]) -> list[Finding]:
    """Interval mode: no two committed batches read the same offset, and a batch whose interval starts where
    another's ends starts each partition where that one ended (else records fell between the two intervals).

    :param batches: the pipeline's batches, any state (only committed ones count).
    """
    committed = sorted((b for b in batches if b.state is BatchState.COMMITTED and b.interval is not None),
                       key=lambda b: (_interval(b).start, b.batch_id))
    findings: list[Finding] = []
    by_end = {_interval(b).end: b for b in committed}
    per_partition: dict[TopicPartition, list[tuple[OffsetRange, int]]] = {}
    for batch in committed:
        previous = by_end.get(_interval(batch).start)
        before = {r.key: r.until_offset for r in previous.ranges} if previous is not None else {}
        for r in batch.ranges:
            per_partition.setdefault(r.key, []).append((r, batch.batch_id))
            if previous is not None and r.key in before and r.from_offset > before[r.key]:
                findings.append(Finding(Check.TILING, _tp(r.key), (
                    f"gap: offsets {before[r.key]}..{r.from_offset} lie between interval {_interval(previous)} "
                    f"(batch {previous.batch_id}) and the next one, {_interval(batch)} (batch {batch.batch_id}): "
                    "read by neither")))
    for key, found in sorted(per_partition.items()):
        found.sort(key=lambda item: (item[0].from_offset, item[0].until_offset))
        for (a, batch_a), (b, batch_b) in zip(found, found[1:], strict=False):
            if a.size and b.size and b.from_offset < a.until_offset:
                findings.append(Finding(Check.TILING, _tp(key), (
                    f"overlap: offsets {b.from_offset}..{min(a.until_offset, b.until_offset)} were read by batch "
                    f"{batch_a} and by batch {batch_b}")))
    return findings


def _interval(batch: BatchRecord) -> Interval:
    assert batch.interval is not None
    return batch.interval


# --------------------------------------------------------------------------- (b) the consumer-group mirror


def check_mirror(group: str, committed: Mapping[TopicPartition, int], group_offsets: Mapping[TopicPartition, int],
                 without_records: Collection[TopicPartition] = ()) -> list[Finding]:
    """The group holds exactly the store's committed offsets (the store is the truth; the group is for lag tools).

    :param group: the group's id.
    :param committed: the store's committed offsets.
    :param group_offsets: the group's committed offsets (partitions without one left out).
    :param without_records: partitions the group may lack: a Kafka sink's transactions commit the group only on
        the partitions a batch read records from (it is not mirrored), so one it never read has no offset there.
    """
    findings = []
    for key in sorted(set(committed) | set(group_offsets)):
        store, mirror = committed.get(key), group_offsets.get(key)
        if store == mirror or (mirror is None and key in without_records):
            continue
        if mirror is None:
            what = f"group {group} has no committed offset; the store has {store}"
        elif store is None:
            what = f"group {group} has {mirror}; the store has no committed offset for the partition"
        else:
            what = (f"group {group} has {mirror}, the store {store}: lag tools show a lag "
                    f"{'too high' if mirror < store else 'too low'} by {abs(store - mirror)} offsets")
        findings.append(Finding(Check.MIRROR, _tp(key), what + " (the pipeline's next batch mirrors it again)"))
    return findings


# --------------------------------------------------------------------------- (c) nothing of a batch left open


def check_branches(xids: Sequence[Xid], batches: Mapping[int, BatchRecord]) -> list[Finding]:
    """Prepared branches whose batch is over (committed, aborted, or not in the store): still open, they hold row
    locks and, of a committed batch, rows that do not show yet. Branches of an unfinished batch may be a running
    attempt's: not findings (``airflow eo status`` shows them).

    :param xids: the pipeline's prepared branches on the sink's server.
    :param batches: the pipeline's batches by id.
    """
    findings = []
    for xid in sorted(xids, key=lambda x: x.encode()):
        batch = batches.get(xid.batch_id)
        if batch is not None and batch.state in UNFINISHED:
            continue
        decision = decide_branch(xid, batch)
        effect = ("its rows do not show until it is committed" if decision.action is BranchAction.COMMIT
                  else "it holds row locks until it is rolled back")
        findings.append(Finding(Check.IN_DOUBT, f"branch {decision.xid}", (
            f"still prepared: {decision.reason}; {effect} (the next run, or `airflow eo recover --apply`, "
            f"will {'commit' if decision.action is BranchAction.COMMIT else 'roll back'} it)")))
    return findings


def check_sink_commits(unfinished: Sequence[BatchRecord], committed_by_sink: Iterable[int]) -> list[Finding]:
    """Unfinished batches whose sink already committed them (a Kafka transaction: the commit point) while the store
    has not recorded it: the store and the output disagree until recovery rolls them forward.

    :param unfinished: the store's unfinished batches.
    :param committed_by_sink: the ids of those the sink committed
        (:func:`~airflow_eo.core.recovery.committed_by_kafka`).
    """
    done = set(committed_by_sink)
    return [Finding(Check.IN_DOUBT, f"batch {b.batch_id}", (
        f"committed by the sink's transaction (run {b.run_id}) but {b.state.value} in the store: the next run, or "
        "`airflow eo recover --apply`, records it")) for b in unfinished if b.batch_id in done]


def check_open_transactions(open_on_output: Mapping[TopicPartition, tuple[int, int]],
                            unfinished: Sequence[BatchRecord]) -> list[Finding]:
    """Transactions open on a Kafka sink's output topic while none of the pipeline's batches is unfinished: a
    producer that died mid-batch without its transaction being aborted yet (this pipeline's, or another writer of
    the topic). ``read_committed`` readers see nothing past the last stable offset until it ends. With a batch
    unfinished, an open transaction may be its own: nothing is said.

    :param open_on_output: (last stable offset, end offset) of each partition where they differ.
    :param unfinished: the store's unfinished batches.
    """
    if unfinished:
        return []
    return [Finding(Check.IN_DOUBT, _tp(key), (
        f"a transaction is open (last stable offset {stable}, end {end}) while no batch of this pipeline is "
        "unfinished: read_committed consumers see nothing past it until it ends. It is aborted by the broker when "
        "its transaction.timeout.ms passes, or by the pipeline's next run if it is this pipeline's"))
        for key, (stable, end) in sorted(open_on_output.items())]


# --------------------------------------------------------------------------- (d) Airflow runs


#: Task states after which a run is over without success (Airflow's TaskInstanceState values).
FAILED_STATES = frozenset({"failed", "upstream_failed", "skipped", "removed"})


@dataclass(frozen=True)
class TaskRun:
    """One run of the pipeline's task as Airflow's metadata database has it."""

    run_id: str
    state: str | None  # the task instance's state (Airflow's TaskInstanceState value); None: not scheduled
    interval: Interval | None = None  # the run's data interval (interval mode's batch identity)
    pipeline_id: str | None = None  # the task's rendered pipeline_id in that run, where Airflow kept it
    started: datetime | None = None  # when the task instance started (None: not known)


def runs_the_history_answers_for(runs: Sequence[TaskRun], batches: Sequence[BatchRecord],
                                 audit: Iterable[AuditEntry]) -> list[TaskRun]:
    """``runs`` less those whose batches an ``airflow eo prune`` may have removed: a run that started before the
    newest prune's cutoff and has no batch left (a batch is written after its run starts, and a prune removes only
    batches last written before its cutoff, so a run started since keeps its batch). Its batch cannot be asked any
    more, so it is no finding (nor is a run marked success by hand that long ago)."""
    cutoffs = [_aware(datetime.fromisoformat(a.details["cutoff"])) for a in audit
               if a.action == PRUNE_ACTION and a.details.get("cutoff")]
    if not cutoffs:
        return list(runs)
    before = max(cutoffs)
    recorded = {b.run_id for b in batches}
    return [r for r in runs if r.run_id in recorded or r.started is None or _aware(r.started) >= before]


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def runs_in_question(runs: Sequence[TaskRun], batches: Sequence[BatchRecord], pipeline_id: str | None) -> list[str]:
    """The successful runs of the task that recorded no batch of the pipeline and whose rendered ``pipeline_id``
    (where Airflow kept it) does not name another pipeline: whether another pipeline of the store recorded them
    decides whether they are findings (:func:`check_runs`)."""
    recorded = {b.run_id for b in batches}
    intervals = {b.interval for b in batches if b.interval is not None and b.state is BatchState.COMMITTED}
    return sorted(r.run_id for r in runs if r.state == "success" and r.run_id not in recorded
                  and (r.interval is None or r.interval not in intervals)
                  and r.pipeline_id in (None, pipeline_id))


def check_runs(runs: Sequence[TaskRun], batches: Sequence[BatchRecord], audited: Iterable[int] = (),
               pipeline_id: str | None = None, recorded_elsewhere: Mapping[str, str] | None = None) -> list[Finding]:
    """Every run whose task succeeded has its batch committed (its run id's, or in interval mode its interval's);
    every committed batch belongs to a run of the task that Airflow knows (or to an audited recovery) and that run
    did not end failed.

    A run of the task belongs to the pipeline whose store recorded it, or that its rendered ``pipeline_id`` names:
    the task's ``pipeline_id`` may change (edited, templated from the run's conf, renamed), and a run of an earlier
    id is that pipeline's, not a finding of this one. Only a run no pipeline recorded (and whose rendered id, if
    known, is this pipeline's) is.

    :param runs: the task's runs (any state).
    :param batches: the pipeline's batches (any state).
    :param audited: batches an audited recovery committed (:func:`audited_batches`).
    :param pipeline_id: the pipeline checked (None: every run of the task is taken for its own).
    :param recorded_elsewhere: run id -> the other pipeline of the store that recorded a batch of it.
    """
    elsewhere = recorded_elsewhere or {}
    committed = [b for b in batches if b.state is BatchState.COMMITTED]
    by_run = {b.run_id: b for b in committed}
    by_interval = {b.interval: b for b in committed if b.interval is not None}
    run_by_id = {r.run_id: r for r in runs}
    runs_by_interval: dict[Interval, list[TaskRun]] = {}
    for run in runs:
        if run.interval is not None:
            runs_by_interval.setdefault(run.interval, []).append(run)
    exempt = set(audited)
    findings = []
    for run in sorted(runs, key=lambda r: r.run_id):
        if run.state != "success":
            continue
        if run.run_id in by_run or (run.interval is not None and run.interval in by_interval):
            continue
        if run.run_id in elsewhere or (pipeline_id is not None and run.pipeline_id not in (None, pipeline_id)):
            continue  # another pipeline's run (the task's pipeline_id was another then)
        planned = [b for b in batches if b.run_id == run.run_id]
        found = (f"its batch {planned[-1].batch_id} is {planned[-1].state.value}" if planned
                 else "the store has no batch of it")
        findings.append(Finding(Check.RUNS, f"run {run.run_id}", (
            f"the task succeeded in Airflow but {found}: nothing of this run is committed (marked success by "
            "hand?); clear the task to run a batch")))
    for batch in sorted(committed, key=lambda b: b.batch_id):
        owners = [run_by_id[batch.run_id]] if batch.run_id in run_by_id else []
        if batch.interval is not None:
            owners += runs_by_interval.get(batch.interval, [])
        if not owners:
            if batch.batch_id not in exempt:
                findings.append(Finding(Check.RUNS, f"batch {batch.batch_id}", (
                    f"committed by run {batch.run_id}, which Airflow does not know (its run deleted, or another "
                    "DAG's task wrote the pipeline) and no audited recovery committed it")))
        elif all(r.state in FAILED_STATES for r in owners) and batch.batch_id not in exempt:
            states = ", ".join(sorted({str(r.state) for r in owners}))
            findings.append(Finding(Check.RUNS, f"batch {batch.batch_id}", (
                f"committed, but the task of run {batch.run_id} is {states} in Airflow: clear the task (its next "
                "attempt finds the batch committed and does nothing else)")))
    return findings
