from airflow_eo.core.backlog import backlog, backlog_reached
from airflow_eo.core.planning import PartitionOffsets


def test_backlog_counts_from_committed_or_initial_offsets_and_ignores_lost_records():
    parts = [PartitionOffsets("t", 0, 0, 10, 0), PartitionOffsets("t", 1, 50, 60, 0), PartitionOffsets("t", 2, 0, 7, 7)]
    assert backlog(parts, {("t", 0): 4, ("t", 1): 20}) == {"t[0]": 6, "t[1]": 10, "t[2]": 0}


def test_backlog_reached_in_total_or_per_partition():
    lag = {"t[0]": 3, "t[1]": 4}
    assert backlog_reached(lag, 7, per_partition=False)
    assert not backlog_reached(lag, 5, per_partition=True)
    assert backlog_reached(lag, 4, per_partition=True)
