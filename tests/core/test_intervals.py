from datetime import datetime, timedelta, timezone

import pytest

from airflow_eo.core.errors import ConfigurationError, DataLossError, IntervalNotReadyError
from airflow_eo.core.planning import Interval, IntervalOffsets, check_replayable, plan_interval
from airflow_eo.core.ranges import OffsetRange

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def hour(h: int) -> Interval:
    return Interval(T0 + h * HOUR, T0 + (h + 1) * HOUR)


def test_adjacent_intervals_share_their_boundary_offset():
    # offsets_for_times of the boundaries 0h, 1h, 2h on two partitions
    at = {0: {0: 0, 1: 3}, 1: {0: 10, 1: 3}, 2: {0: 25, 1: 9}}
    plans = [plan_interval([IntervalOffsets("t", p, 0, 30, at[h][p], at[h + 1][p]) for p in (0, 1)], hour(h))
             for h in (0, 1)]
    assert plans[0].ranges == [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 3, 3)]
    assert plans[1].ranges == [OffsetRange("t", 0, 10, 25), OffsetRange("t", 1, 3, 9)]


def test_an_interval_whose_end_was_not_reached_is_not_planned():
    with pytest.raises(IntervalNotReadyError, match=r"t\[1\] \(last stable offset 7\)"):
        plan_interval([IntervalOffsets("t", 0, 0, 30, 0, 10), IntervalOffsets("t", 1, 0, 7, 2, None)], hour(0))


def test_an_end_inside_an_open_transaction_is_not_ready():
    with pytest.raises(IntervalNotReadyError, match="open transaction"):
        plan_interval([IntervalOffsets("t", 0, 0, 5, 0, 8)], hour(0))


def test_an_empty_interval_is_an_empty_range():
    plan = plan_interval([IntervalOffsets("t", 0, 0, 30, 12, 12)], hour(0))
    assert plan.ranges == [OffsetRange("t", 0, 12, 12)] and plan.ranges[0].size == 0


def test_replay_fails_when_retention_deleted_part_of_the_recorded_ranges():
    check_replayable([IntervalOffsets("t", 0, 5, 30, None, None)], [OffsetRange("t", 0, 5, 9)])
    with pytest.raises(DataLossError, match=r"t\[0\] offsets 2..4"):
        check_replayable([IntervalOffsets("t", 0, 5, 30, None, None)], [OffsetRange("t", 0, 2, 9)])


def test_intervals_need_time_zones_and_a_positive_length():
    with pytest.raises(ConfigurationError, match="time zone"):
        Interval(datetime(2026, 1, 1), datetime(2026, 1, 2))
    with pytest.raises(ConfigurationError, match="is empty"):
        Interval(T0, T0)
    local = timezone(timedelta(hours=2))
    assert Interval(T0.astimezone(local), T0.astimezone(local) + HOUR).start == T0
    assert hour(0).end_ms - hour(0).start_ms == 3_600_000


IDLE = timedelta(minutes=5)
LATER = T0 + HOUR + IDLE  # hour(0) ended IDLE ago


def idle(partition: int = 1, **kw) -> IntervalOffsets:
    """A partition with records only before hour(0)'s end: offsets 0..6, nothing at or after 1h."""
    fields = {"log_start": 0, "last_stable": 7, "start": 2, "end": None, "high_watermark": 7,
              "log_append_time": True, **kw}
    return IntervalOffsets("t", partition, **fields)


def test_an_idle_partition_is_closed_at_its_last_stable_offset_after_the_idle_timeout():
    busy = IntervalOffsets("t", 0, 0, 30, 0, 10)
    plan = plan_interval([busy, idle()], hour(0), idle_timeout=IDLE, now=LATER)
    assert plan.ranges == [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 2, 7)]
    # The next hour, planned later, when new records (stamped after 1h) follow offset 7: same boundary.
    after = IntervalOffsets("t", 1, 0, 12, start=7, end=12, high_watermark=12, log_append_time=True)
    assert plan_interval([after], hour(1)).ranges == [OffsetRange("t", 1, 7, 12)]
    # An idle partition that had nothing in the interval at all is an empty range at its end.
    quiet = idle(start=None)
    assert plan_interval([quiet], hour(0), idle_timeout=IDLE, now=LATER).ranges == [OffsetRange("t", 1, 7, 7)]


@pytest.mark.parametrize(("partition", "idle_timeout", "now", "reason"), [
    (idle(), None, LATER, "idle_partition_timeout"),  # not asked for: the message says how
    (idle(), IDLE, LATER - timedelta(seconds=1), r"last stable offset 7\)"),  # too early
    (idle(log_append_time=False), IDLE, LATER, "CreateTime"),  # a late producer timestamp could still come
    (idle(high_watermark=9), IDLE, LATER, "open transaction holds offsets up to 9"),
])
def test_an_idle_partition_keeps_the_interval_waiting_unless_it_can_be_closed(partition, idle_timeout, now, reason):
    with pytest.raises(IntervalNotReadyError, match=reason):
        plan_interval([partition], hour(0), idle_timeout=idle_timeout, now=now)
