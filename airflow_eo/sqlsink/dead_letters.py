"""The dead-letter table of the SQL sinks (``mysql``, ``postgres``): its write through the driver, into the same
partition writer the executors use (:class:`~airflow_eo.core.protocol.ExecutorDeadLetters`), and what
``airflow eo dead-letters`` and the DAG tab read."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from airflow_eo.core.batch import BatchContext, DeadLetter, PartitionWriter, dead_letter_chunks
from airflow_eo.sqlsink.database import SqlDatabase

#: Seconds the ALTER bringing an older release's dead-letter table up to date waits for other pipelines' prepared
#: branches on it before this batch goes on without the new columns (a branch in doubt waits for its pipeline).
DEAD_LETTER_UPGRADE_WAIT_S = 5


def write_dead_letters_through_driver(batch: BatchContext, records: Iterator[DeadLetter],
                                      dead_letter_writer: Callable[[BatchContext], PartitionWriter]) -> list[str]:
    """Dead letters streamed through the driver (the engine's path when its executors could not write them): in
    chunks bounded by count and bytes (:func:`~airflow_eo.core.batch.dead_letter_chunks`) into one writer of
    ``dead_letter_writer`` (the sink's, as the executors get it: one XA branch / prepared transaction, or fenced
    upsert transactions), as the driver's partition (-1). The writer is made, and with it the table, only with the
    first dead letter. Returns the xid of a prepared branch, if any."""
    first = next(records, None)
    if first is None:
        return []
    writer = dead_letter_writer(batch)
    chunks = (pa.RecordBatch.from_pylist(rows)
              for rows in dead_letter_chunks(itertools.chain([first], records), batch.pipeline_id, batch.batch_id))
    xid, _ = writer(chunks, -1, 0, 0)
    return [xid] if xid else []



def read_dead_letters(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str, pipeline_id: str,
                      batch_id: int | None, limit: int) -> list[dict[str, Any]] | None:
    """The pipeline's dead letters (oldest offsets first); None when the table does not exist.

    :param database: the sink's database.
    :param connect_kwargs: the driver's arguments of the sink's database.
    :param table: the dead-letter table (``table`` or ``schema.table``).
    :param pipeline_id: the pipeline.
    :param batch_id: only this batch's.
    :param limit: at most this many.
    """
    where, args = "pipeline_id = %s", list[Any]([pipeline_id])
    if batch_id is not None:
        where += " AND batch_id = %s"
        args.append(batch_id)
    limited = database.dialect.limit.format(n="%s")
    try:
        # Every column: a table of an older release, not written since, has no kafka_headers yet.
        found = database.read_dicts(connect_kwargs, f"SELECT * FROM {database.quote_table(table)} WHERE {where} "
                                    f"ORDER BY batch_id, topic, kafka_partition, kafka_offset {limited}",
                                    (*args, limit))
    except database.errors() as exc:
        if database.is_missing_table(exc):
            return None
        raise
    # Byte for byte: a table an older release made may compare ids without case ("p" would read "P"'s).
    return [row for row in found if row["pipeline_id"] == pipeline_id]
