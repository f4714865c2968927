"""When an event-driven run is due: the decision of :class:`~airflow_eo.triggers.events.EoBacklogTrigger` (an
Airflow ``AssetWatcher``'s trigger, DESIGN section 17) over one look at a pipeline's backlog. Pure logic: the hooks
read Kafka and the store, this decides.

- **The backlog that calls for a run is the unplanned one**: from where the unfinished (planned or prepared)
  batches end, or from the committed position where there is none, to the last stable offset. Records a batch
  in flight already covers call for no other run.
- **Fire** when that backlog reaches ``min_records`` or its oldest record is ``max_delay`` old.
- **Then hold (debounce)** until a batch commits past where the backlog it fired for began (the run it started,
  or any run, processed it): no event storm while that run is queued or running; an empty batch moves nothing.
- **Or until ``min_interval`` passed** since the last event (or since the watcher started) with no such commit:
  the event may have been lost, or the run that planned the records failed for good. The whole backlog then
  counts, planned records included, and one more event goes out; its run resumes or aborts that batch and plans
  again (every run is exactly-once whatever started it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_eo.core.backlog import BacklogThreshold, oldest_age_seconds
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.ranges import OffsetRange, TopicPartition

#: The longest wait between two looks while the store or the broker does not answer.
MAX_RETRY_DELAY_S = 60.0


def planned_positions(committed: Mapping[TopicPartition, int],
                      planned: Sequence[OffsetRange]) -> dict[TopicPartition, int]:
    """Where the next plan starts once the unfinished batches commit: per partition the end of its furthest planned
    range, or its committed position. Read the unfinished batches before the committed offsets: a batch committing
    in between is then seen in one or the other, and the larger of the two is right either way."""
    positions = dict(committed)
    for r in planned:
        positions[r.key] = max(positions.get(r.key, r.until_offset), r.until_offset)
    return positions


def moved_past(committed: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int]) -> bool:
    """A batch committed past ``starts`` (where a backlog began): some partition's committed offset is beyond its
    start, or a partition without a start (never committed nor planned then) has one now."""
    return any(k not in starts or offset > starts[k] for k, offset in committed.items())


@dataclass(frozen=True)
class BacklogLook:
    """One look at a pipeline's backlog: what the shared poll hands every watcher of the pipeline.

    :param at: when it was taken (monotonic seconds of the poller's process).
    :param committed: the store's committed offsets.
    :param starts: where the unplanned backlog starts (:func:`planned_positions`).
    :param unplanned: offsets per ``"topic[partition]"`` from ``starts`` to the last stable offset.
    :param total: offsets per ``"topic[partition]"`` from ``committed`` (planned ones included).
    :param unplanned_age: age (s) of the oldest unplanned record; None if not read or none.
    :param total_age: age (s) of the oldest uncommitted record; None if not read or none.
    """

    at: float
    committed: Mapping[TopicPartition, int]
    starts: Mapping[TopicPartition, int]
    unplanned: Mapping[str, int]
    total: Mapping[str, int]
    unplanned_age: float | None = None
    total_age: float | None = None

    @classmethod
    def of(cls, at: float, committed: Mapping[TopicPartition, int], starts: Mapping[TopicPartition, int],
           total: tuple[Mapping[str, int], Mapping[str, int]], unplanned: tuple[Mapping[str, int], Mapping[str, int]],
           now_ms: int) -> BacklogLook:
        """From the lag and the first records' timestamps (ms, empty when not read) counted from ``committed`` and
        from ``starts``."""
        return cls(at, dict(committed), dict(starts), dict(unplanned[0]), dict(total[0]),
                   oldest_age_seconds(unplanned[1], now_ms), oldest_age_seconds(total[1], now_ms))


@dataclass(frozen=True)
class LookFailed:
    """A look that did not happen: the store or the broker did not answer. Never an event; polled again after
    ``retry_in`` seconds."""

    error: str
    failures: int  # in a row
    retry_in: float


def retry_delay(poll_interval: float, failures: int, cap: float = MAX_RETRY_DELAY_S) -> float:
    """Backoff after ``failures`` failed looks in a row: the poll interval doubled per failure, at most ``cap`` (or
    the poll interval, when it is longer)."""
    return float(max(poll_interval, min(cap, poll_interval * 2 ** min(failures, 30))))


@dataclass(frozen=True)
class Fired:
    at: float  # when (the look's ``at``)
    starts: Mapping[TopicPartition, int]  # where the backlog it fired for began


@dataclass(frozen=True)
class WatchState:
    """What one watcher remembers between looks (in memory: a restarted triggerer starts afresh)."""

    since: float  # when the watcher started: the reference for ``min_interval`` before its first event
    fired: Fired | None = None


@dataclass(frozen=True)
class RunRule:
    """When a watcher fires: ``min_records`` unplanned records or the oldest ``max_delay_seconds`` old, whichever
    comes first; at most once per backlog (see the module's text) and again after ``min_interval_seconds``."""

    min_records: int | None = 1
    max_delay_seconds: float | None = None
    min_interval_seconds: float = 300.0
    threshold: BacklogThreshold = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            threshold = BacklogThreshold(self.min_records, False, self.max_delay_seconds)
        except ConfigurationError as error:
            raise ConfigurationError(str(error).replace("min_age", "max_delay")) from None
        if self.min_interval_seconds <= 0:
            raise ConfigurationError("min_interval must be a positive duration (how long one event holds without a "
                                     "commit before the backlog fires again)")
        object.__setattr__(self, "threshold", threshold)

    @property
    def needs_age(self) -> bool:
        return self.max_delay_seconds is not None


@dataclass(frozen=True)
class Decision:
    fire: bool
    reason: str
    state: WatchState
    payload: dict[str, Any] = field(default_factory=dict)  # the event's (JSON), when it fires


def decide(rule: RunRule, look: BacklogLook, state: WatchState) -> Decision:
    """Fire or not on ``look``, and the watcher's state after it."""
    fired = state.fired
    fresh = fired is None or moved_past(look.committed, fired.starts)
    waited = look.at - (fired.at if fired is not None else state.since)
    unplanned = rule.threshold.reached(look.unplanned, look.unplanned_age)
    if fresh and unplanned:
        return _fire(rule, look, "backlog", look.starts, look.unplanned, look.unplanned_age)
    if waited >= rule.min_interval_seconds and rule.threshold.reached(look.total, look.total_age):
        return _fire(rule, look, "no_commit_within_min_interval", look.committed, look.total, look.total_age)
    if unplanned:
        reason = (f"holding: an event went out {waited:.0f} s ago and no batch committed past its backlog since "
                  f"(again after min_interval, {rule.min_interval_seconds:g} s)")
    else:
        reason = f"waiting: {sum(look.unplanned.values())} unplanned records (fires at {rule.threshold.describe()})"
    return Decision(False, reason, state)


def _fire(rule: RunRule, look: BacklogLook, reason: str, starts: Mapping[TopicPartition, int],
          lag: Mapping[str, int], age: float | None) -> Decision:
    """An event for the backlog that begins at ``starts`` (``lag`` and ``age`` are what its payload reports)."""
    payload = {"reason": reason, **rule.threshold.report(lag, age)}
    return Decision(True, reason, WatchState(since=look.at, fired=Fired(look.at, dict(starts))), payload)
