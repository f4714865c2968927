"""The offsets' half of the commit point (``docs/architecture.md``, "The offset store"): every partition of a batch
compare-and-set from where the batch starts to where it ends, in the store's commit transaction.

A statement per :data:`CAS_PARTITIONS` partitions, not one per partition: a batch over a thousand partitions
committed in 0.58 s, most of it a thousand round trips. Each statement moves only rows still at the batch's start;
when it moves fewer than its partitions, the rows it left are read to tell a partition the store has no row of yet
(inserted: a concurrent first commit of it fails on the key) from one another run moved (refused, and the
transaction rolls back whole).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.errors import CommitConflictError
from airflow_eo.core.ranges import OffsetRange, TopicPartition, batch_starts

#: partitions per statement (the update takes six parameters each; PostgreSQL takes at most 65,535 per statement)
CAS_PARTITIONS = 500


def advance_offsets(cur: Any, batch: BatchRecord) -> None:
    """Move each of ``batch``'s partitions from its start (:func:`~airflow_eo.core.ranges.batch_starts`) to the end
    of its range, or raise :class:`CommitConflictError` naming the first partition (in the batch's order) that is
    elsewhere. ``cur``: a cursor of the commit's transaction, rows as dicts."""
    starts = batch_starts(batch.ranges, batch.skipped)
    ranges = list(batch.ranges)
    for first in range(0, len(ranges), CAS_PARTITIONS):
        chunk = ranges[first:first + CAS_PARTITIONS]
        cur.execute(
            "UPDATE eo_offset SET next_offset = CASE "
            + " ".join(["WHEN topic = %s AND kafka_partition = %s THEN %s"] * len(chunk))
            + " END, batch_id = %s WHERE pipeline_id = %s AND (topic, kafka_partition, next_offset) IN ("
            + ", ".join(["(%s, %s, %s)"] * len(chunk)) + ")",
            (*[v for r in chunk for v in (r.topic, r.partition, r.until_offset)], batch.batch_id, batch.pipeline_id,
             *[v for r in chunk for v in (r.topic, r.partition, starts[r.key])]))
        if cur.rowcount != len(chunk):
            _insert_new_or_refuse(cur, batch, chunk, starts)


def _insert_new_or_refuse(cur: Any, batch: BatchRecord, chunk: Sequence[OffsetRange],
                          starts: dict[TopicPartition, int]) -> None:
    """The partitions of ``chunk`` the update did not move: new ones get their row, a moved one is refused."""
    cur.execute("SELECT topic, kafka_partition, next_offset, batch_id FROM eo_offset WHERE pipeline_id = %s AND "
                f"(topic, kafka_partition) IN ({', '.join(['(%s, %s)'] * len(chunk))})",
                (batch.pipeline_id, *[v for r in chunk for v in (r.topic, r.partition)]))
    rows = {(row["topic"], row["kafka_partition"]): row for row in cur.fetchall()}
    new = []
    for r in chunk:
        row = rows.get((r.topic, r.partition))
        if row is None:
            new.append(r)
        elif (row["batch_id"], row["next_offset"]) != (batch.batch_id, r.until_offset):  # not moved just now
            raise CommitConflictError(
                f"{r.topic}[{r.partition}] is committed at offset {row['next_offset']}, but batch {batch.batch_id} "
                f"starts at {starts[r.key]}; another run moved the offsets, nothing of this batch was committed")
    if new:  # the first batch that reads these partitions
        cur.execute("INSERT INTO eo_offset (pipeline_id, topic, kafka_partition, next_offset, batch_id) VALUES "
                    + ", ".join(["(%s, %s, %s, %s, %s)"] * len(new)),
                    tuple(v for r in new for v in (batch.pipeline_id, r.topic, r.partition, r.until_offset,
                                                   batch.batch_id)))
