"""The decisions of ``dedup_key`` (:mod:`airflow_eo.core.dedup`), without Spark or a database."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_eo.core.config import Mode, ParseConfig, check_pipeline
from airflow_eo.core.dedup import (
    SeenAt,
    check_dedup,
    is_duplicate,
    keep,
    purge_cutoff,
    seen_id_partition,
    sighting_ms,
)
from airflow_eo.core.errors import ConfigurationError

DAY = timedelta(days=1)
HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def at(offset: int, partition: int = 0, ms: int = 1_000_000, topic: str = "t") -> SeenAt:
    return SeenAt(ms, topic, partition, offset)


def test_a_record_never_seen_or_seen_right_here_is_no_duplicate():
    assert not is_duplicate(at(5), None, DAY)
    assert not is_duplicate(at(5), at(5), DAY), "a replay meets its own sighting"


def test_a_copy_of_an_earlier_sighting_is_a_duplicate_within_retention_only():
    assert is_duplicate(at(9), at(3), DAY)
    assert is_duplicate(at(9, partition=1), at(3, partition=0), DAY), "copies may land in another partition"
    assert is_duplicate(at(9, topic="u"), at(3), DAY)
    old = at(3, ms=1_000_000 - 25 * HOUR_MS)
    assert not is_duplicate(at(9), old, DAY), "past retention an id is forgotten"
    assert is_duplicate(at(9), at(3, ms=1_000_000 - 23 * HOUR_MS), DAY)


def test_a_later_record_of_the_same_partition_is_never_what_an_earlier_one_copies():
    assert not is_duplicate(at(3), at(9), DAY)
    assert is_duplicate(at(3, partition=1), at(9, partition=0), DAY), "across partitions the table's sighting wins"


def test_a_batch_keeps_the_first_copy_by_time_then_partition_then_offset():
    sightings = [at(7, ms=20), at(4, partition=2, ms=10), at(2, partition=1, ms=10)]
    assert keep(sightings, None, DAY) == (2, True)
    assert keep([at(1), at(2)], None, DAY) == (0, True)


def test_within_a_partition_the_earlier_offset_is_the_event_whatever_its_timestamp():
    """A producer sets CreateTime: a copy at a later offset dated before the event must not become the event."""
    assert keep([at(7, ms=20), at(9, ms=5)], None, DAY) == (0, True)
    assert keep([at(9, ms=5), at(7, ms=20), at(3, partition=1, ms=10)], None, DAY) == (2, True)


def test_a_replayed_batch_keeps_the_record_the_table_has_and_writes_nothing():
    sightings = [at(9, ms=5), at(4, ms=50)]  # the copy at offset 9 has the earlier timestamp
    assert keep(sightings, at(4, ms=50), DAY) == (1, False)


def test_a_batch_whose_event_was_seen_earlier_keeps_nothing_of_it():
    assert keep([at(9), at(12)], at(3), DAY) == (None, False)
    stale = at(3, ms=1_000_000 - 30 * 24 * HOUR_MS)
    assert keep([at(9), at(12)], stale, DAY) == (0, True), "a sighting past retention is replaced"


def test_the_purge_cutoff_spares_every_id_a_record_of_the_batch_may_copy():
    cutoff = purge_cutoff(1_000_000, DAY)
    assert cutoff == 1_000_000 - 24 * HOUR_MS
    assert not is_duplicate(at(9), at(3, ms=cutoff - 1), DAY), "what is purged was no duplicate's sighting"


def test_seen_id_branches_never_share_a_partition_number_with_output_dead_letters_or_the_driver():
    numbers = {seen_id_partition(p) for p in range(1000)}
    assert len(numbers) == 1000
    assert not numbers & ({-1} | set(range(1000)) | {-2 - p for p in range(1000)})


class Sink:
    def __init__(self, keeps: bool) -> None:
        self.name, self.replay_safe, self.keeps_dead_letters, self.delete_keys = "S", True, True, ()
        self.keeps_seen_ids = keeps


def parse(**options) -> ParseConfig:
    return ParseConfig("json", "event_id STRING", **options)


def test_dedup_key_is_refused_in_interval_mode_and_with_a_sink_that_keeps_no_seen_ids():
    check_pipeline(Sink(True), Mode.CONTINUOUS, parse(dedup_key=["event_id"]), None)
    with pytest.raises(ConfigurationError, match="mode='interval'.*order the intervals ran in"):
        check_pipeline(Sink(True), Mode.INTERVAL, parse(dedup_key=["event_id"]), None)
    with pytest.raises(ConfigurationError, match="S has no table to keep them in"):
        check_pipeline(Sink(False), Mode.CONTINUOUS, parse(dedup_key=["event_id"]), None)
    check_pipeline(Sink(False), Mode.CONTINUOUS, parse(), None)  # without dedup_key, any sink


@pytest.mark.parametrize(("key", "retention", "said"), [
    (("a", "a"), DAY, "names a column twice"), (("",), DAY, "must name columns"),
    (("a",), timedelta(0), "positive timedelta")])
def test_bad_dedup_options_say_what_to_fix(key, retention, said):
    with pytest.raises(ConfigurationError, match=said):
        check_dedup(key, retention, interval_mode=False, sink_name="S", sink_keeps_seen_ids=True)


def test_the_write_tasks_mark_copies_when_every_record_of_an_id_and_every_key_meets_in_one_task():
    from airflow_eo.core.dedup import marks_in_write_tasks

    assert marks_in_write_tasks(("event_id",), ("event_id",), transform=False, one_pass=True)
    assert marks_in_write_tasks(("event_id",), ("app_id", "event_id"), transform=False, one_pass=True)
    assert marks_in_write_tasks(("event_id",), (), transform=False, one_pass=True)  # appended: any spread will do
    # a key of the table whose rows may carry two ids would reach two tasks; a transform's rows are no records;
    # a two-pass write gives its writers the good records only, after counting
    assert not marks_in_write_tasks(("event_id",), ("app_id",), transform=False, one_pass=True)
    assert not marks_in_write_tasks(("key.id",), ("event_id",), transform=False, one_pass=True)
    assert not marks_in_write_tasks(("event_id",), ("event_id",), transform=True, one_pass=True)
    assert not marks_in_write_tasks(("event_id",), ("event_id",), transform=False, one_pass=False)
    assert not marks_in_write_tasks((), ("event_id",), transform=False, one_pass=True)


def test_a_records_dedup_time_is_its_timestamp_within_the_batchs_retention_window():
    now = 10 * DAY_MS
    assert sighting_ms(now - HOUR_MS, now, DAY) == now - HOUR_MS  # a live record keeps its time
    assert sighting_ms(now + DAY_MS, now, DAY) == now  # dated in the future: the batch's clock
    assert sighting_ms(0, now, DAY) == now - DAY_MS  # dated long ago: the window's start
    assert sighting_ms(0, None, DAY) == 0  # no clock known: the timestamp
    # The purge's cutoff from the oldest record is then never more than two retentions behind the clock.
    assert purge_cutoff(sighting_ms(0, now, DAY), DAY) == now - 2 * DAY_MS
