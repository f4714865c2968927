"""When an event-driven run is due (``core/backlog_events.py``): the decision of ``EoBacklogTrigger`` over looks
made of plain values."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from airflow_eo.core.backlog_events import (
    MAX_RETRY_DELAY_S,
    BacklogLook,
    RunRule,
    WatchState,
    decide,
    moved_past,
    planned_positions,
    retry_delay,
)
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.ranges import OffsetRange

T0, T1 = ("t", 0), ("t", 1)


def look(at: float, committed: dict, ends: dict, planned: Sequence[OffsetRange] = (), first_ms: dict | None = None,
         now_ms: int = 0) -> BacklogLook:
    """A look at topic ``t`` whose partitions end at ``ends`` (last stable offsets), as the trigger makes it."""
    starts = planned_positions(committed, list(planned))

    def lag(positions: dict) -> tuple[dict, dict]:
        counted = {f"t[{p}]": end - positions.get(("t", p), 0) for (_, p), end in ends.items()}
        first = {k: ms for k, ms in (first_ms or {}).items() if counted[k]}
        return counted, first

    return BacklogLook.of(at, committed, starts, lag(committed), lag(starts), now_ms)


def test_planned_positions_are_where_the_unfinished_batches_end_or_the_committed_offsets():
    planned = [OffsetRange("t", 0, 10, 25), OffsetRange("t", 2, 0, 4)]
    assert planned_positions({T0: 10, T1: 7}, planned) == {T0: 25, T1: 7, ("t", 2): 4}
    # read before the committed offsets: a batch that committed in between is counted once either way
    assert planned_positions({T0: 25}, [OffsetRange("t", 0, 10, 25)]) == {T0: 25}
    assert planned_positions({T0: 30}, [OffsetRange("t", 0, 10, 25)]) == {T0: 30}


def test_moved_past_a_backlog_start():
    starts = {T0: 10, T1: 5}
    assert not moved_past({T0: 10, T1: 5}, starts)
    assert not moved_past({T0: 8}, starts)  # an older view: nothing new committed
    assert moved_past({T0: 11, T1: 5}, starts)
    assert moved_past({T0: 10, T1: 5, ("t", 2): 1}, starts)  # a partition first committed since


def test_fires_once_for_a_backlog_then_holds_until_a_commit_moves_past_it():
    rule = RunRule(min_records=100, min_interval_seconds=300)
    state = WatchState(since=0.0)
    quiet = decide(rule, look(1, {T0: 0, T1: 0}, {T0: 40, T1: 50}), state)
    assert not quiet.fire and quiet.reason.startswith("waiting: 90 unplanned records")

    first = decide(rule, look(2, {T0: 0, T1: 0}, {T0: 60, T1: 50}), quiet.state)
    assert first.fire and first.payload == {"reason": "backlog", "lag": {"t[0]": 60, "t[1]": 50}, "total": 110}
    # queued, then running with the batch planned: the same and more records call for no second event
    held = decide(rule, look(3, {T0: 0, T1: 0}, {T0: 500, T1: 500}), first.state)
    assert not held.fire and held.reason.startswith("holding")
    running = [OffsetRange("t", 0, 0, 60), OffsetRange("t", 1, 0, 50)]
    held = decide(rule, look(4, {T0: 0, T1: 0}, {T0: 500, T1: 500}, running), held.state)
    assert not held.fire
    # an empty batch commits nothing: still held
    assert not decide(rule, look(5, {T0: 0, T1: 0}, {T0: 500, T1: 500}), held.state).fire
    # its batch committed past where the backlog began: the records after it are a new backlog
    after = decide(rule, look(6, {T0: 60, T1: 50}, {T0: 500, T1: 500}), held.state)
    assert after.fire and after.payload["total"] == 890
    nothing_new = decide(rule, look(7, {T0: 500, T1: 500}, {T0: 500, T1: 500}), after.state)
    assert not nothing_new.fire and nothing_new.reason.startswith("waiting: 0")


def test_records_a_batch_in_flight_covers_call_for_no_run():
    rule = RunRule(min_records=10)
    in_flight = [OffsetRange("t", 0, 0, 100)]
    waiting = decide(rule, look(1, {}, {T0: 105}, in_flight), WatchState(since=0))
    assert not waiting.fire and waiting.reason.startswith("waiting: 5 unplanned")
    assert decide(rule, look(2, {}, {T0: 110}, in_flight), waiting.state).fire


def test_a_commit_of_the_batch_already_in_flight_does_not_release_the_hold():
    rule = RunRule(min_records=10)
    in_flight = [OffsetRange("t", 0, 0, 100)]
    fired = decide(rule, look(1, {}, {T0: 150}, in_flight), WatchState(since=0))
    assert fired.fire and fired.payload["total"] == 50
    # the earlier run commits what it had planned, up to where our backlog begins: our run is still to come
    assert not decide(rule, look(2, {T0: 100}, {T0: 150}), fired.state).fire
    # our run committed: released
    assert decide(rule, look(3, {T0: 150}, {T0: 170}), fired.state).fire


def test_fires_again_after_min_interval_without_a_commit_counting_planned_records_too():
    rule = RunRule(min_records=10, min_interval_seconds=60)
    fired = decide(rule, look(0, {T0: 0}, {T0: 20}), WatchState(since=0))
    assert fired.fire
    stuck = [OffsetRange("t", 0, 0, 20)]  # its run planned the records, then failed for good
    assert not decide(rule, look(59, {T0: 0}, {T0: 20}, stuck), fired.state).fire
    again = decide(rule, look(60, {T0: 0}, {T0: 20}, stuck), fired.state)
    assert again.fire and again.payload == {"reason": "no_commit_within_min_interval", "lag": {"t[0]": 20},
                                            "total": 20}
    assert not decide(rule, look(61, {T0: 0}, {T0: 20}, stuck), again.state).fire
    # the run of that event aborted the stuck batch and committed the records: new ones are a new backlog at once
    assert decide(rule, look(70, {T0: 20}, {T0: 30}), again.state).fire
    # a watcher that never fired (a restarted triggerer) counts from its start
    assert not decide(rule, look(59, {T0: 0}, {T0: 20}, stuck), WatchState(since=0)).fire
    assert decide(rule, look(60, {T0: 0}, {T0: 20}, stuck), WatchState(since=0)).fire


def test_below_min_records_the_oldest_records_age_fires():
    rule = RunRule(min_records=1000, max_delay_seconds=30)
    assert rule.needs_age
    young = decide(rule, look(1, {T0: 0}, {T0: 5}, first_ms={"t[0]": 80_000}, now_ms=100_000), WatchState(since=0))
    assert not young.fire
    old = decide(rule, look(2, {T0: 0}, {T0: 5}, first_ms={"t[0]": 70_000}, now_ms=100_000), young.state)
    assert old.fire and old.payload == {"reason": "backlog", "lag": {"t[0]": 5}, "total": 5,
                                        "oldest_age_seconds": 30.0}
    assert not decide(RunRule(min_records=None, max_delay_seconds=30), look(3, {T0: 0}, {T0: 0}),
                      WatchState(since=0)).fire  # nothing unprocessed: no age


def test_rules_and_backoff():
    for bad in ({"min_records": None}, {"min_records": 0}, {"min_interval_seconds": 0},
                {"max_delay_seconds": -1.0}):
        with pytest.raises(ConfigurationError):
            RunRule(**bad)
    with pytest.raises(ConfigurationError, match="max_delay"):
        RunRule(min_records=None, max_delay_seconds=None)
    assert [retry_delay(2.0, n) for n in range(1, 7)] == [4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert retry_delay(0.5, 10**6) == MAX_RETRY_DELAY_S and retry_delay(120.0, 1) == 120.0  # never below the poll
