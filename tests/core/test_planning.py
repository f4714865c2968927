import pytest

from airflow_eo.core.errors import DataLossError
from airflow_eo.core.planning import PartitionOffsets, plan_batch, share_by_lag
from airflow_eo.core.ranges import OffsetRange


def parts(*specs):
    return [PartitionOffsets("t", p, log_start, stable, initial) for p, log_start, stable, initial in specs]


def test_new_partitions_start_at_their_initial_offset_and_end_at_last_stable():
    plan = plan_batch(parts((0, 0, 10, 0), (1, 5, 20, 20)), committed={})
    assert plan.ranges == [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 20, 20)]
    assert not plan.skipped


def test_committed_partitions_continue_where_the_last_batch_ended():
    plan = plan_batch(parts((0, 0, 10, 0), (1, 0, 20, 0)), committed={("t", 0): 7, ("t", 1): 20})
    assert plan.ranges == [OffsetRange("t", 0, 7, 10), OffsetRange("t", 1, 20, 20)]
    assert sum(r.size for r in plan.ranges) == 3


def test_cap_is_shared_by_lag_and_sums_exactly_to_the_cap():
    plan = plan_batch(parts((0, 0, 900, 0), (1, 0, 100, 0), (2, 0, 0, 0)), committed={}, max_records_per_run=100)
    sizes = {r.partition: r.size for r in plan.ranges}
    assert sizes == {0: 90, 1: 10, 2: 0}


def test_share_by_lag_rounds_by_largest_remainder():
    shares = share_by_lag({("t", 0): 1, ("t", 1): 1, ("t", 2): 1}, 2)
    assert sum(shares.values()) == 2
    assert all(0 <= v <= 1 for v in shares.values())


def test_share_never_exceeds_a_partitions_lag():
    shares = share_by_lag({("t", 0): 3, ("t", 1): 1000}, 500)
    assert shares[("t", 0)] <= 3 and sum(shares.values()) == 500


def test_start_below_log_start_fails_naming_the_lost_range():
    with pytest.raises(DataLossError, match=r"t\[0\] offsets 5\.\.9.*skip_lost_records"):
        plan_batch(parts((0, 10, 30, 0)), committed={("t", 0): 5})


def test_skip_lost_records_starts_at_log_start_and_records_the_gap():
    plan = plan_batch(parts((0, 10, 30, 0)), committed={("t", 0): 5}, skip_lost_records=True)
    assert plan.ranges == [OffsetRange("t", 0, 10, 30)]
    assert plan.skipped == [OffsetRange("t", 0, 5, 10)]


def test_committed_beyond_the_end_of_the_partition_is_an_error():
    with pytest.raises(DataLossError, match="beyond the end"):
        plan_batch(parts((0, 0, 10, 0)), committed={("t", 0): 11})


def test_empty_plan():
    plan = plan_batch(parts((0, 0, 10, 0)), committed={("t", 0): 10})
    assert all(r.size == 0 for r in plan.ranges)
