"""The executor side of ``dedup_key`` (:func:`airflow_eo.spark.dedup.duplicate_marks`, the write tasks'
``TaskCopies``) on Arrow batches, with an in-memory seen-id table: which records of a task are copies and which are
first sightings, and the seen-id rows a write task writes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa

from airflow_eo.core.batch import TaskDedup
from airflow_eo.core.dedup import SeenAt, seen_pipeline_key
from airflow_eo.spark.dedup import ID, TaskCopies, duplicate_marks, seen_id_table

T0 = datetime(2026, 11, 26, tzinfo=timezone.utc)


def batch(rows: list[tuple[str | None, int, int, int]]) -> pa.RecordBatch:
    """(event id, partition, offset, seconds after T0) per record; a None id is a bad record."""
    return pa.RecordBatch.from_pydict({
        "value": [f"v{o}" for _, _, o, _ in rows],
        "kafka_topic": ["t"] * len(rows),
        "kafka_partition": pa.array([p for _, p, _, _ in rows], pa.int32()),
        "kafka_offset": pa.array([o for _, _, o, _ in rows], pa.int64()),
        "kafka_timestamp": pa.array([T0 + timedelta(seconds=s) for *_, s in rows], pa.timestamp("us", tz="UTC")),
        ID: pa.array([i for i, *_ in rows], pa.string())})


def marks(rows, stored=None, retention=timedelta(days=7)) -> dict[int, tuple[bool, bool]]:
    asked: list[list[str]] = []

    def lookup(ids):
        asked.append(sorted(ids))
        return {i: s for i, s in (stored or {}).items() if i in set(asked[-1])}

    table = pa.Table.from_batches([batch(rows)])
    columns = {name: i for i, name in enumerate(table.schema.names)}
    duplicate, new = duplicate_marks(table, columns, lookup, retention)
    assert len(asked) == 1 and None not in asked[0], "one look-up per task, of the good records' ids"
    return {o: (d, n) for o, d, n in zip(table.column("kafka_offset").to_pylist(), duplicate.to_pylist(),
                                         new.to_pylist(), strict=True)}


def test_copies_in_the_same_task_keep_the_first_by_time_and_bad_records_are_left_alone():
    got = marks([("a", 0, 1, 10), ("a", 1, 7, 5), ("a", 0, 3, 20), ("b", 0, 2, 1), (None, 0, 4, 0)])
    assert got == {7: (False, True), 1: (True, False), 3: (True, False), 2: (False, True), 4: (False, False)}


def test_an_id_seen_by_an_earlier_batch_drops_every_copy_and_a_replay_keeps_its_own_record():
    earlier = SeenAt(int(T0.timestamp() * 1000), "t", 0, 0)
    assert marks([("a", 0, 5, 30), ("a", 0, 6, 40)], {"a": earlier}) == {5: (True, False), 6: (True, False)}
    own = SeenAt(int(T0.timestamp() * 1000) + 40_000, "t", 0, 6)
    assert marks([("a", 0, 5, 30), ("a", 0, 6, 40)], {"a": own}) == {5: (True, False), 6: (False, False)}


def test_an_id_past_retention_is_seen_anew():
    old = SeenAt(int(T0.timestamp() * 1000) - 10 * 86_400_000, "t", 0, 0)
    assert marks([("a", 0, 5, 30)], {"a": old}) == {5: (False, True)}


def test_a_task_with_an_empty_partition_marks_nothing_and_asks_nothing():
    def lookup(ids):
        raise AssertionError("an empty partition has no ids to look up")

    copies = TaskCopies()
    assert copies.mark(iter(()), {}, TaskDedup(None, lookup, timedelta(days=7), "p", 1)) == []  # type: ignore[arg-type]
    assert (copies.duplicates, copies.oldest_ms, copies.first_sightings) == (0, None, None)


def test_a_write_task_hands_on_the_events_and_keeps_its_first_sightings_for_the_seen_id_table():
    rows = [("a", 0, 1, 10), ("a", 1, 7, 5), ("b", 0, 2, 1), (None, 0, 4, 0), ("c", 0, 5, 3)]
    first = batch(rows)
    columns = {name: i for i, name in enumerate(first.schema.names)}
    stored = {"c": SeenAt(int(T0.timestamp() * 1000), "t", 1, 0)}  # c copies an event of an earlier batch
    copies = TaskCopies()
    kept = pa.Table.from_batches(copies.mark([first], columns, TaskDedup(
        None, lambda ids: {i: s for i, s in stored.items() if i in set(ids)}, timedelta(days=7),  # type: ignore[arg-type]
        "pipeline", 9)))
    assert sorted(kept.column("kafka_offset").to_pylist()) == [2, 4, 7]  # the bad record goes on, to be counted
    assert copies.duplicates == 2
    assert copies.oldest_ms == int(T0.timestamp() * 1000) + 1000  # the oldest good record (b, 1 s after T0)
    seen = copies.first_sightings.sort_by("event_id").to_pylist()
    assert [(r["event_id"], r["kafka_partition"], r["kafka_offset"], r["seen_at"], r["batch_id"]) for r in seen] == [
        ("a", 1, 7, int(T0.timestamp() * 1000) + 5000, 9), ("b", 0, 2, int(T0.timestamp() * 1000) + 1000, 9)]
    assert {r["pipeline_key"] for r in seen} == {seen_pipeline_key("pipeline")}
    assert seen_id_table(pa.Table.from_batches([first]), columns, pa.array([False] * 5), "p", 1).num_rows == 0


def test_no_sighting_is_dated_after_the_batchs_wall_clock():
    """A producer sets a topic's CreateTime: a first sighting dated in the future would never pass retention (every
    later copy dropped as a duplicate, whatever the retention) and never be purged. The seen-id rows are dated no
    later than the batch's wall clock, and a stored sighting dated after it (written before) is no evidence."""
    now_ms = int(T0.timestamp() * 1000) + 60_000
    table = pa.Table.from_batches([batch([("a", 0, 5, 10 * 365 * 86_400), ("b", 0, 6, 30)])])
    columns = {name: i for i, name in enumerate(table.schema.names)}
    duplicate, new = duplicate_marks(table, columns, lambda ids: {}, timedelta(days=7), now_ms)
    rows = seen_id_table(table, columns, new, "p", 3, now_ms)
    assert rows.column("seen_at").to_pylist() == [now_ms, int(T0.timestamp() * 1000) + 30_000]

    forged = SeenAt(int(T0.timestamp() * 1000) + 100 * 365 * 86_400_000, "t", 0, 0)
    duplicate, new = duplicate_marks(table.slice(1), columns, lambda ids: {"b": forged}, timedelta(days=7), now_ms)
    assert (duplicate.to_pylist(), new.to_pylist()) == ([False], [True])


def test_a_record_dated_long_ago_counts_from_the_retention_windows_start_and_holds_no_purge_back():
    """A producer that dates a record at 1970 in every batch held the purge's cutoff (the batch's oldest record less
    the retention) at 1970 - retention: nothing was ever purged. Such a record now counts as dated at the start of
    the batch's retention window: the task's oldest time (the purge's base) is no earlier than that, its sighting is
    stored at it, and a copy of it in a batch within the retention of the clock is still dropped."""
    retention = timedelta(days=7)
    now_ms = int(T0.timestamp() * 1000) + 60_000
    window_start = now_ms - 7 * 86_400_000
    epoch = -int(T0.timestamp())  # seconds after T0 of 1970-01-01
    first = batch([("a", 0, 5, epoch), ("b", 0, 6, 30)])
    columns = {name: i for i, name in enumerate(first.schema.names)}
    copies = TaskCopies()
    copies.mark([first], columns, TaskDedup(None, lambda ids: {}, retention, "p", 1, now_ms))  # type: ignore[arg-type]
    assert copies.oldest_ms == window_start
    seen = {r["event_id"]: r["seen_at"] for r in copies.first_sightings.to_pylist()}
    assert seen == {"a": window_start, "b": int(T0.timestamp() * 1000) + 30_000}

    later_ms = now_ms + 86_400_000  # a day later, its copy dated 1970 too
    stored = {"a": SeenAt(window_start, "t", 0, 5)}
    copy = pa.Table.from_batches([batch([("a", 1, 9, epoch)])])
    duplicate, new = duplicate_marks(copy, columns, lambda ids: stored, retention, later_ms)
    assert (duplicate.to_pylist(), new.to_pylist()) == ([True], [False])
