"""The executor side of ``dedup_key`` (:func:`airflow_eo.spark.dedup._marked`) on Arrow batches, with an in-memory
seen-id table: which records of a task are copies and which are first sightings."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa

from airflow_eo.core.dedup import SeenAt
from airflow_eo.spark.dedup import DUPLICATE, ID, NEW, _marked

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

    first = batch(rows)
    columns = {name: i for i, name in enumerate(first.schema.names)}
    out = pa.Table.from_batches(list(_marked([first], columns, lookup, retention))).to_pylist()
    assert len(asked) == 1 and None not in asked[0], "one look-up per task, of the good records' ids"
    return {r["kafka_offset"]: (r[DUPLICATE], r[NEW]) for r in out}


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

    assert list(_marked(iter(()), {}, lookup, timedelta(days=7))) == []
