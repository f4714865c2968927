"""The seen-id table of ``dedup_key`` (:mod:`airflow_eo.core.dedup`) in a SQL sink's database, once for every
database: its DDL, the executors' look-up of a batch's ids, and the bounded purge of old ids. Its rows are written by
the sink's own partition writer (upserts keyed by pipeline and id: its own branch or fenced transaction per task,
committed with the batch's output)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_eo.core.dedup import SeenAt
from airflow_eo.sqlsink.database import SqlDatabase
from airflow_eo.sqlsink.pipeline_tables import create_if_missing, rows_by_ids

#: The table's name, in the sink's database (the connection's default schema); one table, keyed by pipeline.
SEEN_ID_TABLE = "eo_seen_ids"
#: How long a purge waits for a row lock before it gives up (the next batch purges again).
PURGE_LOCK_WAIT_S = 5


def seen_id_table_ddl(quoted_table: str, binary: str, key_binary: str, inline_index: str = "",
                      table_options: str = "") -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the seen-id table (``seen_at``: epoch ms), in a database's spelling of its
    8- and 16-byte keys (``binary``: ``{n}`` bytes) and with its inline definition of the purge's
    (pipeline_key, seen_at) index, if it has one."""
    return (f"CREATE TABLE IF NOT EXISTS {quoted_table} ("
            f"pipeline_key {key_binary.format(n=8)} NOT NULL, event_id {key_binary.format(n=16)} NOT NULL, "
            "topic VARCHAR(249) NOT NULL, kafka_partition INT NOT NULL, kafka_offset BIGINT NOT NULL, "
            f"seen_at BIGINT NOT NULL, batch_id BIGINT NOT NULL, PRIMARY KEY (pipeline_key, event_id){inline_index})"
            f"{table_options}")


@dataclass(frozen=True)
class SeenIdLookup:
    """Where a batch's event ids were seen before, read by the executors (picklable: a Spark task runs it)."""

    database: SqlDatabase
    connect_kwargs: Mapping[str, Any] = field(repr=False)  # holds the password
    table: str
    pipeline_key: bytes

    def __call__(self, event_ids: Iterable[bytes]) -> dict[bytes, SeenAt]:
        return {bytes(event_id): SeenAt(int(seen_at), topic, int(partition), int(offset))
                for event_id, seen_at, topic, partition, offset in rows_by_ids(
                    self.database, self.connect_kwargs, self.table, self.pipeline_key, "event_id",
                    "seen_at, topic, kafka_partition, kafka_offset", event_ids)}


def create_seen_id_table(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str) -> None:
    """The table, when missing (DDL on the driver, before any branch of the batch starts: DDL may commit)."""
    create_if_missing(database, connect_kwargs, table, database.seen_id_ddl, database.seen_id_indexes)


def purge_seen_ids(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str, key: bytes,
                   before_ms: int, limit: int) -> int:
    """Remove at most ``limit`` of the pipeline's ids seen before ``before_ms``, in a transaction of their own;
    returns how many went."""
    conn = database.connect(connect_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            # Old ids next to another pipeline's prepared branch wait for it: a few seconds, then the next batch.
            cur.execute(database.row_lock_wait(PURGE_LOCK_WAIT_S))
            return database.purge_seen_ids(cur, table, key, before_ms, limit)
    finally:
        conn.close()
