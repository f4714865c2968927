"""A pipeline's end and its new name (``airflow eo retire``, ``airflow eo rename``): the decisions, made here once.

- Whether a run may be going on (:func:`active_run`): the store's facts only, since the store is what every
  attempt writes. A batch that is planned or prepared and was written less than ``idle_s`` ago, or (continuous mode)
  an epoch taken less than ``idle_s`` ago by an attempt that has not planned since, is a run's; an epoch an audited
  operation took (``recover``, ``rewind``) is nobody's run. A batch written longer ago is in doubt, not running: its
  attempt stopped writing (killed, or a Spark job longer than ``idle_s``, which the fence then stops from
  committing).
- Whether a retire or a rename may go on (:func:`retire_refusal`, :func:`rename_refusal`), and what a retire
  removes (:func:`retire_plan`).
- What a run of a retired id is told (:func:`retired_message`). A retired id runs again after
  ``airflow eo retire ID --undo --apply --reason TEXT`` (audited), not by an option of the DAG: who brings a pipeline
  back is on record, and a DAG file edited back by mistake does not bring it back.

The roles the operations use are here too: :class:`PipelineRows` (a sink's rows keyed by the pipeline beside its
output: seen ids, change positions, dead letters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import UNFINISHED
from airflow_eo.core.config import Mode
from airflow_eo.core.identifiers import validate_pipeline_id
from airflow_eo.core.pipeline_status import PipelineInfo

#: How long a pipeline must have been quiet (no take, no batch written) before retire and rename treat it as not
#: running (``--idle-for``): longer than a run takes between two writes of the store, i.e. its Spark job.
DEFAULT_IDLE_S = 600.0
#: The audit actions.
RETIRE_ACTION, UNRETIRE_ACTION, RENAME_ACTION = "retire", "unretire", "rename"
#: The audited operations that take the epoch without a run (their epoch is nobody's running attempt).
OPERATIONS_TAKING_EPOCH = frozenset({"recover", "recover orphans", "rewind", RETIRE_ACTION, UNRETIRE_ACTION,
                                     RENAME_ACTION})


@runtime_checkable
class PipelineRows(Protocol):
    """A sink that keeps rows keyed by the pipeline beside its output (seen ids, change positions, dead letters)."""

    def pipeline_rows(self, pipeline_id: str, dead_letters: bool) -> dict[str, int]:
        """How many rows of the pipeline each such table holds (a missing table: none)."""

    def remove_pipeline_rows(self, pipeline_id: str, dead_letters: bool) -> dict[str, int]:
        """Delete them (dead letters only when asked), in one transaction; how many went, per table."""

    def move_pipeline_rows(self, old: str, new: str) -> dict[str, int]:
        """Give ``old``'s rows to ``new``, in one transaction; how many moved, per table."""


@dataclass(frozen=True)
class BatchSeen:
    """A batch row and when it was last written (the store's clock, UTC)."""

    record: BatchRecord
    updated_at: datetime | None


def active_run(info: PipelineInfo, batches: Sequence[BatchSeen], operation_epochs: Sequence[int], now: datetime,
               idle_s: float) -> str | None:
    """Why a run of the pipeline may be going on, or None.

    :param info: the pipeline (its epoch and when it was taken).
    :param batches: its unfinished batches and its newest batch, with when each was last written.
    :param operation_epochs: the epochs audited operations took (the newest audit rows'): not a run's.
    :param now: the time (UTC, aware).
    :param idle_s: how long a run may go without writing the store.
    """
    for b in sorted(batches, key=lambda b: b.record.batch_id):
        if b.record.state in UNFINISHED and b.updated_at is not None and _age(b.updated_at, now) < idle_s:
            return (f"batch {b.record.batch_id} is {b.record.state.value}, written {_age(b.updated_at, now):.0f}s ago "
                    f"by the attempt holding epoch {b.record.epoch} (quiet for less than {idle_s:g}s)")
    if info.mode is Mode.INTERVAL or info.taken_at is None or info.epoch in operation_epochs:
        return None
    if any(b.record.epoch == info.epoch for b in batches):
        return None  # the attempt holding the epoch planned, and its batch is finished (or quiet: above)
    taken = _age(info.taken_at, now)
    if taken < idle_s:
        return (f"epoch {info.epoch} was taken {taken:.0f}s ago by an attempt that has planned no batch yet (quiet "
                f"for less than {idle_s:g}s)")
    return None


def retire_refusal(info: PipelineInfo, active: str | None) -> str | None:
    """Why ``retire --apply`` must not go on (None: it may)."""
    if active is not None:
        return (f"pipeline {info.pipeline_id!r} may have a run going on: {active}. Wait for it to end (or pause the "
                "DAG and let it end), then retire it; --idle-for sets how long a pipeline must have been quiet")
    return None


def rename_refusal(info: PipelineInfo, new_id: str, new_exists: bool, active: str | None,
                   in_doubt: Sequence[str]) -> str | None:
    """Why ``rename --apply`` must not go on (None: it may).

    :param info: the pipeline renamed (OLD).
    :param new_id: its new id.
    :param new_exists: whether the store has a pipeline ``new_id`` (retired or not).
    :param active: :func:`active_run`'s answer.
    :param in_doubt: OLD's in-doubt work (branches, unfinished batches), described.
    """
    old = info.pipeline_id
    if new_id == old:
        return f"the new id is the pipeline's id {old!r}"
    if new_exists:
        return (f"the offset store already has a pipeline {new_id!r}: a rename never merges two pipelines' offsets "
                "and history; choose another id, or retire and remove that one first")
    if info.retired_at is not None:
        return (f"pipeline {old!r} is retired: bring it back first (airflow eo retire {old} --undo --apply "
                "--reason TEXT)")
    if info.mode is Mode.INTERVAL:
        return (f"pipeline {old!r} runs in interval mode, whose fences and batches are per interval: renaming it is "
                "not supported; give its DAG a new pipeline id (interval mode replays by interval)")
    if active is not None:
        return (f"pipeline {old!r} may have a run going on: {active}. Pause its DAG, wait for the run to end, then "
                "rename")
    if in_doubt:
        return (f"pipeline {old!r} has work in doubt ({'; '.join(in_doubt)}): its branches and batches carry its id, "
                f"so they are resolved under it first: airflow eo recover {old} --apply --reason TEXT, then rename")
    return None


def check_new_pipeline_id(new_id: str) -> str:
    """The new id, checked as the operator checks a ``pipeline_id``."""
    return validate_pipeline_id(new_id)


@dataclass(frozen=True)
class RetirePlan:
    """What ``retire`` removes of a pipeline beside the store's rows it keeps (offsets, batches, audit)."""

    pipeline_id: str
    consumer_group: str | None  # the group airflow_eo.<id> (mirror, or the Kafka sink's offsets)
    sink_rows: Mapping[str, int] = field(default_factory=dict)  # table -> rows (seen ids, change positions, ..)
    dead_letters: bool = False  # the dead letters are removed too (asked)
    notes: Sequence[str] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "consumer_group": self.consumer_group,
                "sink_rows": dict(self.sink_rows), "dead_letters": self.dead_letters, "notes": list(self.notes)}


def retire_plan(info: PipelineInfo, group: str | None, keeps_rows: bool, rows: Mapping[str, int],
                dead_letters: bool) -> RetirePlan:
    """What a retire removes.

    :param info: the pipeline.
    :param group: its consumer group (None: it has none, interval mode).
    :param keeps_rows: whether its sink keeps rows keyed by the pipeline (:class:`PipelineRows`).
    :param rows: how many rows each of those tables holds (dead letters counted only when asked).
    :param dead_letters: remove its dead letters too (``--dead-letters``).
    """
    notes = ["kept: the pipeline row (its tombstone), its offsets, batch history and audit log"]
    if not keeps_rows:
        notes.append(f"its sink ({info.sink.kind if info.sink else 'unknown'}) keeps no rows of the pipeline beside "
                     "its output")
    elif not dead_letters:
        notes.append("its dead letters are kept (--dead-letters removes them)")
    return RetirePlan(info.pipeline_id, group, dict(rows), dead_letters and keeps_rows, notes)


def seed_refusal(pipeline_id: str, existing: PipelineInfo | None, has_run: bool,
                 offsets: Mapping[tuple[str, int], int], partitions: Sequence[tuple[str, int]]) -> str | None:
    """Why ``airflow eo seed`` (the starting offsets of a pipeline that has not run in this store: a pipeline moved
    from another store) must not go on (None: it may).

    :param pipeline_id: the pipeline.
    :param existing: its row in this store, if any.
    :param has_run: whether this store holds a batch or a committed offset of it.
    :param offsets: the starting offsets given, per (topic, partition).
    :param partitions: every partition of the topics named, as the broker lists them.
    """
    if existing is not None and existing.retired_at is not None:
        return (f"pipeline {pipeline_id!r} is retired in this store: seed a new id (or bring it back: airflow eo "
                f"retire {pipeline_id} --undo)")
    if has_run:
        return (f"pipeline {pipeline_id!r} has run in this store already: `airflow eo rewind {pipeline_id} "
                "--to-offsets` moves its offsets")
    if not offsets:
        return "no starting offset given"
    missing = sorted(set(partitions) - set(offsets))
    if missing:
        return ("name every partition of the topics (not named: "
                + ", ".join(f"{t}[{p}]" for t, p in missing)
                + "): a partition not named would start at the operator's starting_offsets, not where the pipeline "
                  "stopped")
    return None


def retired_message(pipeline_id: str, retired_at: datetime | None) -> str:
    """What a run of a retired pipeline id is told."""
    when = retired_at.isoformat(timespec="seconds") if retired_at else "earlier"
    return (f"pipeline id {pipeline_id!r} was retired ({when}; `airflow eo history {pipeline_id}` says by whom and "
            f"why). A retired id does not run again by accident: to run it again, continuing from its committed "
            f"offsets, run `airflow eo retire {pipeline_id} --undo --apply --reason TEXT`; to start afresh, give the "
            "task another pipeline_id=")


def _age(moment: datetime, now: datetime) -> float:
    return max(0.0, (now - moment).total_seconds())
