"""The offsets' half of the commit point (``docs/architecture.md``, "The offset store"): every partition of a batch
compare-and-set from where the batch starts to where it ends, in the store's commit transaction.

A statement per :data:`CAS_PARTITIONS` partitions, not one per partition (a batch over a thousand partitions spent
most of a 0.58 s commit on a thousand round trips). The statement joins a table of the batch's partitions to
``eo_offset`` by its primary key, so it reads and locks only the batch's own rows, and moves only those still at the
batch's start (and, on MariaDB at REPEATABLE READ, the gap where a partition without a row yet would go, as the
statement per partition did). When it moves fewer than the chunk's partitions, the chunk's rows are read back: a
partition the store has no row of yet is inserted (a concurrent first commit of it fails on the key); one elsewhere
than at the batch's end was moved by another run (refused, and the transaction rolls back whole); and the rows at the
batch's end must be exactly those the statement moved. The read-back locks nothing (PostgreSQL cannot lock the
nullable side of an outer join): it reads current rows because the commit's first statement is the fence's locking
read of the pipeline's row, which every writer of the pipeline's offsets takes first, and nothing before it reads
without a lock (which would fix MariaDB's snapshot earlier).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.errors import CommitConflictError
from airflow_eo.core.ranges import OffsetRange, TopicPartition, batch_starts, repeated_partition
from airflow_eo.sqlstore.dialect import StoreDialect

#: partitions per statement (each takes six parameters; PostgreSQL takes at most 65,535 per statement)
CAS_PARTITIONS = 500

#: the columns of the table of partitions ``b`` (none named as ``eo_offset``'s updated columns: MySQL would find
#: ``SET batch_id`` ambiguous)
_MOVES = ("pipeline_id", "topic", "kafka_partition", "start_offset", "end_offset", "new_batch_id")
_TEXT = ("pipeline_id", "topic")
_MATCH = "o.pipeline_id = b.pipeline_id AND o.topic = b.topic AND o.kafka_partition = b.kafka_partition"


def advance_offsets(cur: Any, dialect: StoreDialect, batch: BatchRecord) -> None:
    """Move each of ``batch``'s partitions from its start (:func:`~airflow_eo.core.ranges.batch_starts`) to the end
    of its range, or raise :class:`CommitConflictError` naming the first partition (in the batch's order) that is
    elsewhere. ``cur``: a cursor of the commit's transaction, rows as dicts, a row count of the rows matched."""
    ranges = list(batch.ranges)
    repeated = repeated_partition(ranges)
    if repeated is not None:  # refused when planned (insert_batch); one row cannot move twice in a statement
        raise ValueError(f"batch {batch.batch_id} of {batch.pipeline_id!r} names {repeated[0]}[{repeated[1]}] twice")
    starts = batch_starts(ranges, batch.skipped)
    for first in range(0, len(ranges), CAS_PARTITIONS):
        chunk = ranges[first:first + CAS_PARTITIONS]
        moves = tuple(v for r in chunk for v in (batch.pipeline_id, r.topic, r.partition, starts[r.key],
                                                 r.until_offset, batch.batch_id))
        rows = dialect.parameter_table(_MOVES, _TEXT, len(chunk))
        cur.execute(dialect.update_from.format(table="eo_offset", rows=rows, match=_MATCH,
                                               assign="next_offset = b.end_offset, batch_id = b.new_batch_id",
                                               where="o.next_offset = b.start_offset"), moves)
        if cur.rowcount != len(chunk):
            _insert_new_or_refuse(cur, dialect, batch, chunk, starts, moves, moved=cur.rowcount)


def _insert_new_or_refuse(cur: Any, dialect: StoreDialect, batch: BatchRecord, chunk: Sequence[OffsetRange],
                          starts: dict[TopicPartition, int], moves: tuple[Any, ...], moved: int) -> None:
    """The partitions of ``chunk`` the update did not move: new ones get their row, a moved one is refused.

    :param moves: the update's parameters (the table of the chunk's partitions).
    :param moved: the rows it moved.
    """
    cur.execute(f"SELECT b.topic, b.kafka_partition, o.next_offset, o.batch_id FROM "
                f"{dialect.parameter_table(_MOVES, _TEXT, len(chunk))} LEFT JOIN eo_offset AS o ON {_MATCH}", moves)
    rows = {(row["topic"], int(row["kafka_partition"])): row for row in cur.fetchall()}
    new, at_end = [], 0
    for r in chunk:
        row = rows[r.key]
        if row["next_offset"] is None:
            new.append(r)
        elif (row["batch_id"], row["next_offset"]) == (batch.batch_id, r.until_offset):
            at_end += 1
        else:
            raise CommitConflictError(
                f"{r.topic}[{r.partition}] is committed at offset {row['next_offset']}, but batch {batch.batch_id} "
                f"starts at {starts[r.key]}; another run moved the offsets, nothing of this batch was committed")
    if at_end != moved:  # a row already at this batch's end before the update: the batch was committed before
        raise CommitConflictError(
            f"{at_end - moved} of the partitions of batch {batch.batch_id} of {batch.pipeline_id!r} were already "
            "at its end: another run committed it, nothing of this attempt was committed")
    if new:  # the first batch that reads these partitions
        cur.execute("INSERT INTO eo_offset (pipeline_id, topic, kafka_partition, next_offset, batch_id) VALUES "
                    + ", ".join(["(%s, %s, %s, %s, %s)"] * len(new)),
                    tuple(v for r in new for v in (batch.pipeline_id, r.topic, r.partition, r.until_offset,
                                                   batch.batch_id)))
