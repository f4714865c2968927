"""The identity a table sink's commit carries (Delta's txnAppId / txnVersion) and what recovery reads from it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.recovery import committed_by_table, table_transaction
from airflow_eo.core.states import BatchState

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def batch(batch_id: int, interval: Interval | None = None) -> BatchRecord:
    return BatchRecord("p", batch_id, f"run{batch_id}", 1, BatchState.PLANNED, [OffsetRange("t", 0, 0, 5)],
                       interval=interval)


def test_one_app_id_per_pipeline_and_one_per_interval():
    assert table_transaction("p", 7, None) == table_transaction("p", 7, None)
    assert table_transaction("p", 7, None).app_id == "airflow_eo.p"
    early, late = Interval(T0, T0 + HOUR), Interval(T0 + HOUR, T0 + 2 * HOUR)
    # An older interval backfilled after a newer one gets a lower batch id: under the newer one's app id Delta
    # would skip it as already seen; each interval has its own.
    assert table_transaction("p", 3, early).app_id != table_transaction("p", 9, late).app_id
    assert table_transaction("p", 3, early).app_id == table_transaction("p", 3, Interval(T0, T0 + HOUR)).app_id
    assert table_transaction("p", 3, early).app_id != table_transaction("q", 3, early).app_id


def test_a_batch_counts_as_committed_once_its_app_id_reached_its_version():
    early, late = Interval(T0, T0 + HOUR), Interval(T0 + HOUR, T0 + 2 * HOUR)
    unfinished = [batch(4), batch(5, early), batch(6, late)]
    versions = {table_transaction("p", 4, None).app_id: 4, table_transaction("p", 5, early).app_id: None,
                table_transaction("p", 6, late).app_id: 5}
    assert committed_by_table(unfinished, versions) == {4}
    assert committed_by_table([batch(4)], {"airflow_eo.p": 3}) == set()
    assert committed_by_table([batch(4)], {"airflow_eo.p": 8}) == {4}  # Delta would skip it: it is in the table
    assert committed_by_table([batch(4)], {}) == set()
