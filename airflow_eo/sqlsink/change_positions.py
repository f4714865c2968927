"""The change-position table of ``changes=`` (:mod:`airflow_eo.core.changes`) in a SQL sink's database, once for
every database: its DDL, the executors' look-up of a batch's keys, and the bounded purge of old delete markers.

One row per target key of a pipeline: the source position of the last change applied to it, and whether that change
was a delete (a marker: the row is gone, and nothing older may bring it back). The target table keeps only the
source's columns. Its rows are written by the sink's own partition writer after the task's output (upserts keyed by
pipeline and key id: its own branch or fenced transaction per task): a position is never recorded without the write
it stands for, so a replay that finds it finds the write done.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_eo.core.changes import TRUNCATE_KEY
from airflow_eo.sqlsink.database import SqlDatabase
from airflow_eo.sqlsink.pipeline_tables import create_if_missing, rows_by_ids
from airflow_eo.sqlsink.seen_ids import PURGE_LOCK_WAIT_S

if TYPE_CHECKING:
    from airflow_eo.sqlstore.fence import EpochFence

#: The table's name, in the sink's database (the connection's default schema); one table, keyed by pipeline.
CHANGE_POSITION_TABLE = "eo_change_positions"


def change_position_table_ddl(quoted_table: str, key_binary: str, inline_index: str = "",
                              table_options: str = "") -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the change-position table, in a database's spelling of its fixed-size
    binary keys (``key_binary``: ``{n}`` bytes) and with its inline purge index, if it has one."""
    return (f"CREATE TABLE IF NOT EXISTS {quoted_table} ("
            f"pipeline_key {key_binary.format(n=8)} NOT NULL, key_id {key_binary.format(n=16)} NOT NULL, "
            f"position {key_binary.format(n=16)} NOT NULL, deleted INT NOT NULL, changed_at BIGINT NOT NULL, "
            f"batch_id BIGINT NOT NULL, PRIMARY KEY (pipeline_key, key_id){inline_index}){table_options}")


@dataclass(frozen=True)
class PositionLookup:
    """The applied positions of a batch's keys, read by the executors (picklable: a Spark task runs it)."""

    database: SqlDatabase
    connect_kwargs: Mapping[str, Any] = field(repr=False)  # holds the password
    table: str
    pipeline_key: bytes

    def __call__(self, key_ids: Iterable[bytes]) -> dict[bytes, bytes]:
        return {bytes(key_id): bytes(position) for key_id, position in rows_by_ids(
            self.database, self.connect_kwargs, self.table, self.pipeline_key, "key_id", "position", key_ids)}


def create_change_position_table(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str) -> None:
    """The table, when missing (DDL on the driver, before any branch of the batch starts: DDL may commit)."""
    create_if_missing(database, connect_kwargs, table, database.change_position_ddl, database.change_position_indexes)


def purge_delete_markers(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str, key: bytes,
                         before_ms: int, limit: int) -> int:
    """Remove at most ``limit`` of the pipeline's delete markers of changes before ``before_ms``, in a transaction of
    their own; returns how many went. The markers are read without locks, then deleted by primary key, still only
    while they are markers that old (a batch may have written the key anew meanwhile)."""
    conn = database.connect(connect_kwargs, autocommit=True)
    quoted = database.quote_table(table)
    try:
        with conn.cursor() as cur:
            cur.execute(database.row_lock_wait(PURGE_LOCK_WAIT_S))
            cur.execute(f"SELECT key_id FROM {quoted} WHERE pipeline_key = %s AND deleted = 1 AND changed_at < %s "
                        "LIMIT %s", (key, before_ms, limit))
            ids = [bytes(row[0]) for row in cur.fetchall()]
            if not ids:
                return 0
            among, listed = database.one_of("key_id", ids)
            cur.execute(f"DELETE FROM {quoted} WHERE pipeline_key = %s AND {among} AND deleted = 1 "
                        "AND changed_at + 0 < %s", (key, *listed, before_ms))
            return int(cur.rowcount or 0)
    finally:
        conn.close()


def truncate_once(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str, target: str, key: bytes,
                  position: bytes, batch_id: int, fence: EpochFence | None) -> bool:
    """A truncate of the source at ``position``: unless the pipeline's truncate floor (the row of
    :data:`~airflow_eo.core.changes.TRUNCATE_KEY`) is that new already, every row of ``target`` is deleted and the
    floor set, in one transaction, fenced like the attempt's writes (a zombie attempt's takes nothing). A replayed
    batch finds the floor and deletes nothing: the rows written since by changes newer than the truncate stay."""
    conn = database.connect(connect_kwargs, autocommit=False)
    quoted = database.quote_table(table)
    try:
        with conn.cursor() as cur:
            if fence is not None:
                fence.check(cur, "share")
            cur.execute(f"SELECT position FROM {quoted} WHERE pipeline_key = %s AND key_id = %s FOR UPDATE",
                        (key, TRUNCATE_KEY))
            row = cur.fetchone()
            if row is not None and bytes(row[0]) >= position:
                conn.rollback()
                return False
            cur.execute(f"DELETE FROM {database.quote_table(target)}")
            cur.execute(f"DELETE FROM {quoted} WHERE pipeline_key = %s AND key_id = %s", (key, TRUNCATE_KEY))
            cur.execute(f"INSERT INTO {quoted} (pipeline_key, key_id, position, deleted, changed_at, batch_id) "
                        "VALUES (%s, %s, %s, 1, %s, %s)", (key, TRUNCATE_KEY, position, int(time.time() * 1000),
                                                           batch_id))
        conn.commit()
        return True
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()
