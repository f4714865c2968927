import pytest

from airflow_eo.core.backlog import BacklogThreshold, backlog, backlog_reached, oldest_age_seconds
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.planning import PartitionOffsets


def test_backlog_counts_from_committed_or_initial_offsets_and_ignores_lost_records():
    parts = [PartitionOffsets("t", 0, 0, 10, 0), PartitionOffsets("t", 1, 50, 60, 0), PartitionOffsets("t", 2, 0, 7, 7)]
    assert backlog(parts, {("t", 0): 4, ("t", 1): 20}) == {"t[0]": 6, "t[1]": 10, "t[2]": 0}


def test_backlog_reached_in_total_or_per_partition():
    lag = {"t[0]": 3, "t[1]": 4}
    assert backlog_reached(lag, 7, per_partition=False)
    assert not backlog_reached(lag, 5, per_partition=True)
    assert backlog_reached(lag, 4, per_partition=True)


def test_a_threshold_of_records_or_age_whichever_comes_first():
    assert oldest_age_seconds({}, 10_000) is None
    assert oldest_age_seconds({"t[0]": 4_000, "t[1]": 7_000}, 10_000) == 6.0  # the oldest partition's first record
    assert oldest_age_seconds({"t[0]": 12_000}, 10_000) == 0.0  # a producer's clock ahead of ours: never negative
    either = BacklogThreshold(min_records=100, min_age_seconds=60)
    assert not either.reached({"t[0]": 5}, 59.0)
    assert either.reached({"t[0]": 5}, 60.0) and either.reached({"t[0]": 100}, None)
    age_only = BacklogThreshold(min_records=None, min_age_seconds=60)
    assert not age_only.reached({"t[0]": 10**9}, None) and age_only.reached({}, 61.0)
    assert age_only.report({"t[0]": 3}, 61.0) == {"lag": {"t[0]": 3}, "total": 3, "oldest_age_seconds": 61.0}
    assert BacklogThreshold().report({"t[0]": 3}, None) == {"lag": {"t[0]": 3}, "total": 3}
    assert either.describe() == "100 records or a record 60 s old"
    for bad in ({"min_records": None}, {"min_records": 0}, {"min_age_seconds": 0.0}):
        with pytest.raises(ConfigurationError):
            BacklogThreshold(**bad)
