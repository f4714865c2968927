"""What the engine takes from Spark's observed metrics: the counts when the job reported them, else None (the engine
then counts in a pass of its own) -- never a guess and never a crash."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_eo.spark.record_counts import observed_counts


def test_reported_counts_are_taken():
    assert observed_counts(SimpleNamespace(get={"records": 12, "bad": 2})) == (12, 2)


def test_an_action_that_reported_no_metrics_counts_as_not_counted():
    # Spark Connect answers a write command (the Kafka sink's noop write) with no observed metrics (seen in CI).
    assert observed_counts(SimpleNamespace(get={})) is None
    assert observed_counts(None) is None
