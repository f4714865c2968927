"""What the SQL sinks (``mysql``, ``postgres``) share of their dead letters: the path through the driver, into the
same partition writer the executors use (:class:`~airflow_eo.core.protocol.ExecutorDeadLetters`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pyarrow as pa

from airflow_eo.core.batch import BatchContext, DeadLetter, PartitionWriter, dead_letter_chunks

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
