"""Exactly-once per event (``dedup_key``): which records are re-sent copies of an event, decided here.

An at-least-once producer puts one event at two offsets. With ``dedup_key``, a record's event id is the hash of those
columns' values; the first record of an id is *where it was seen*: its topic, partition, offset and Kafka timestamp
(:class:`SeenAt`). The ids a batch sees first are written to the sink's seen-id table with its output, in the same
branches / prepared transactions / fenced transactions (:data:`SEEN_ID_FIELDS`), so they commit exactly when the output
does. A record is a duplicate when its id was seen *elsewhere* (:func:`is_duplicate`):

- at another record earlier in the same batch: of the batch's records of one id, the earliest offset of each
  partition, and of those the first in (Kafka timestamp, partition, offset) order, is the event and the others its
  copies: a copy dated earlier than the event, at a later offset of its partition, never wins (and across
  partitions: a producer that re-sends may hash the copy to another partition, or an upstream job may re-run into
  another topic);
- at a record of an earlier batch that committed, remembered for ``retention`` of record time.

A record's time is its Kafka timestamp kept inside the batch's retention window (:func:`sighting_ms`): producers set
CreateTime, and neither a date in the future nor one long past may keep an id, or the purge, from moving on.

Deciding by *where* an id was seen, never by *which batch* saw it, makes every replay give the rows it gave the first
time: a retried batch, a cleared run or a rewind meets its own records in the table (the same position: not a
duplicate) and the copies of them (another position: a duplicate), whichever attempt wrote the table. Retention is
applied by the check (an id older than the record by more than ``retention`` is not a duplicate), so when the batches
purge old ids (:func:`purge_cutoff`) changes no decision of a batch still to be replayed: a replay's clock is later, so
its records' times are no earlier. (A replay long after may still decide otherwise for a record dated before its
window, whose time moves with the clock: once the window has passed the copy's first sighting, it is new again.)

Interval mode is refused (:func:`check_dedup`): a backfill of an earlier interval would find its events already seen
by a later one, so the result would depend on the order the intervals ran in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.xid import pipeline_key

#: How long an id is remembered unless ``dedup_retention`` says otherwise.
DEFAULT_RETENTION = timedelta(days=7)
#: The seen-id table's columns, in the order its writer gets them: ``pipeline_key`` (:func:`seen_pipeline_key`),
#: ``event_id`` the first 128 bits of the SHA-256 of the key columns' JSON, ``seen_at`` the record's Kafka timestamp in
#: epoch milliseconds. Both keys are short bytes: the table holds a row per event, and its index pages are what a
#: batch's look-ups read.
SEEN_ID_FIELDS = ("pipeline_key", "event_id", "topic", "kafka_partition", "kafka_offset", "seen_at", "batch_id")
#: An id is one row per pipeline: a later sighting (after retention) takes its place.
SEEN_ID_KEY = ("pipeline_key", "event_id")
#: Old ids a batch removes at most (its own transaction, before it writes): bounded work per batch.
PURGE_LIMIT = 10_000


@dataclass(frozen=True, order=True)
class SeenAt:
    """Where a record is: its Kafka timestamp (epoch ms) first, so that sorting orders a batch's copies of an id."""

    timestamp_ms: int
    topic: str
    partition: int
    offset: int

    def position(self) -> tuple[str, int, int]:
        return self.topic, self.partition, self.offset


def is_duplicate(record: SeenAt, stored: SeenAt | None, retention: timedelta) -> bool:
    """Whether ``record`` (the first of its id in its batch) copies the event the seen-id table has at ``stored``.

    Not when the table has no such id, when it has this very record (a replay), when the stored sighting is older
    than the record by more than ``retention``, or when it is a *later* record of the same partition (an id written
    before ``dedup_key`` was set, or by a batch a rewind moved back before: never a duplicate of a later one)."""
    if stored is None or stored.position() == record.position():
        return False
    if stored.timestamp_ms < record.timestamp_ms - retention_ms(retention):
        return False
    return not (stored.topic == record.topic and stored.partition == record.partition
                and stored.offset > record.offset)


def keep(sightings: list[SeenAt], stored: SeenAt | None, retention: timedelta) -> tuple[int | None, bool]:
    """A batch's records of one id (in any order) against the table's sighting of it: the index of the record kept
    (None: all are copies of an earlier event), and whether it is to be written as the id's sighting.

    A replay keeps the very record the table has (whatever the order of the others); else the first of the batch
    (each partition's earliest offset, then :class:`SeenAt` order), unless it copies the stored one
    (:func:`is_duplicate`)."""
    if stored is not None:
        for i, seen in enumerate(sightings):
            if seen.position() == stored.position():
                return i, False
    # Within a partition the earlier offset is the event whatever the timestamps say (a producer sets CreateTime:
    # a copy dated earlier must not win); across partitions, the first in SeenAt order of each one's earliest.
    earliest: dict[tuple[str, int], int] = {}
    for i, seen in enumerate(sightings):
        at = earliest.get((seen.topic, seen.partition))
        if at is None or seen.offset < sightings[at].offset:
            earliest[(seen.topic, seen.partition)] = i
    first = min(earliest.values(), key=sightings.__getitem__)
    if is_duplicate(sightings[first], stored, retention):
        return None, False
    return first, True


def retention_ms(retention: timedelta) -> int:
    return int(retention.total_seconds() * 1000)


def sighting_ms(timestamp_ms: int, now_ms: int | None, retention: timedelta) -> int:
    """A record's time as dedup uses it: its Kafka timestamp, kept between the batch's wall clock (``now_ms``;
    None: not known) less ``retention`` and that clock. A producer sets a topic's CreateTime: a future date would
    keep its id from ever passing retention (every later copy a duplicate) and from ever being purged; a date long
    past, in every batch, would hold the purge's cutoff (:func:`purge_cutoff`, from the batch's oldest record) back
    for ever. So a record dated before the retention window counts as at its start: its copies are then dropped
    for ``retention`` of the batches' clock, and the purge's cutoff is never more than twice the retention behind
    it. A record dated inside the window (a live topic's are) keeps its time."""
    if now_ms is None:
        return timestamp_ms
    return max(min(timestamp_ms, now_ms), now_ms - retention_ms(retention))


def purge_until_caught_up(purge: Callable[[int], int], limit: int = PURGE_LIMIT) -> int:
    """Run ``purge`` (remove at most its argument's number of ids, each call a transaction of its own; how many
    went) until a call removes fewer than ``limit``: a batch of a million new ids must not leave the table a million
    rows longer once retention has passed. How many went in all."""
    removed = 0
    while True:
        went = purge(limit)
        removed += went
        if went < limit:
            return removed


def purge_cutoff(oldest_record_ms: int, retention: timedelta) -> int:
    """The ``seen_at`` below which a batch may remove ids: older than its oldest record by more than the retention,
    so that no record of this batch (nor of a replay of it) can be a duplicate of them any more."""
    return oldest_record_ms - retention_ms(retention)


def seen_pipeline_key(pipeline_id: str) -> bytes:
    """The pipeline's key in the seen-id table: the first 64 bits of the SHA-1 of its id (the xids' pipeline key)."""
    return bytes.fromhex(pipeline_key(pipeline_id))[:8]


def is_seen_id_partition(partition: int) -> bool:
    """Whether ``partition`` (of an xid) is a seen-id writer's (:func:`seen_id_partition`)."""
    return partition <= -(1 << 30)


def seen_id_partition(partition: int) -> int:
    """The partition number (in its xid) of the seen-id writer of Spark partition ``partition``: its own branch or
    transaction, never that of the good rows (``partition``), of the dead letters (-2 - partition) or of the
    driver (-1)."""
    return -(1 << 30) - partition


def marks_in_write_tasks(dedup_key: tuple[str, ...], key_columns: tuple[str, ...] | None, *, transform: bool,
                         one_pass: bool) -> bool:
    """Whether the write tasks themselves can mark a batch's copies (one Spark job: no job of its own that spreads
    every record by id first, caches them and writes the ids apart).

    They can when every record of an id reaches the same write task, and one key of the table never reaches two: the
    records spread by id, with no transform in between (a transform's rows are not records), every ``dedup_key``
    column a column of the output (not a field of the Kafka key) and, for a keyed table, among its key columns
    (two rows of one key then have one id). And when the batch is written in one pass: the writers get every
    record (:attr:`~airflow_eo.core.batch.WritePlan.counts_bad_records`)."""
    if transform or not one_pass or not dedup_key:
        return False
    return not key_columns or set(dedup_key) <= set(key_columns)


def check_dedup(key: tuple[str, ...], retention: timedelta, *, interval_mode: bool, sink_name: str,
                sink_keeps_seen_ids: bool) -> None:
    """The rules of ``dedup_key`` (checked at DAG parse time)."""
    if not key:
        return
    if any(not isinstance(c, str) or not c for c in key):
        raise ConfigurationError(f"dedup_key must name columns of the parsed record, e.g. ['event_id'], not {key!r}")
    if len(set(key)) != len(key):
        raise ConfigurationError(f"dedup_key names a column twice: {list(key)}")
    if retention <= timedelta(0):
        raise ConfigurationError(f"dedup_retention must be a positive timedelta, not {retention!r}")
    if interval_mode:
        raise ConfigurationError(
            "dedup_key with mode='interval': a backfill of an earlier interval would find its events already seen "
            "by a later interval, so what an interval holds would depend on the order the intervals ran in. Use "
            "mode='continuous' for deduplication, or drop dedup_key and deduplicate in the transform")
    if not sink_keeps_seen_ids:
        raise ConfigurationError(
            f"dedup_key with {sink_name}: the ids seen must commit with the output, in the sink's own transaction, "
            f"and {sink_name} has no table to keep them in. Use a MySQL/MariaDB or PostgreSQL sink (the seen ids go "
            "in their database), or drop dedup_key")
