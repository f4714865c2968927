"""What the tables airflow_eo keeps beside a SQL sink's output, one row per pipeline and id (the seen ids of
``dedup_key``, the change positions of ``changes=``), share: made when missing, and read by id in chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from airflow_eo.sqlsink.database import SqlDatabase

#: Ids per look-up statement (bound parameters: a statement stays well below every driver's limit).
LOOKUP_CHUNK = 5000


def rows_by_ids(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str, pipeline_key: bytes,
                id_column: str, columns: str, ids: Iterable[bytes]) -> Iterator[tuple[Any, ...]]:
    """The rows (``id_column``, then ``columns``) of the pipeline's ``ids`` in ``table``, read in chunks and in id
    order: each statement reads a narrow range of the index, not pages all over it (measured on a 1.9M-id table
    larger than the buffer pool: 100,000 ids not there in 4.0 s unsorted, 1.9 s sorted)."""
    ordered = sorted(ids)
    if not ordered:
        return
    conn = database.connect(connect_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            for start in range(0, len(ordered), LOOKUP_CHUNK):
                among, chunk = database.one_of(id_column, ordered[start:start + LOOKUP_CHUNK])
                cur.execute(f"SELECT {id_column}, {columns} FROM {database.quote_table(table)} WHERE pipeline_key = %s "
                            f"AND {among}", (pipeline_key, *chunk))
                yield from cur.fetchall()
    finally:
        conn.close()


def create_if_missing(database: SqlDatabase, connect_kwargs: Mapping[str, Any], table: str,
                      ddl: Callable[[str], str], indexes: Callable[[str], list[str]]) -> None:
    """``table`` made with ``ddl(table)`` and ``indexes(table)`` when missing (DDL on the driver, before any branch of
    the batch starts: DDL may commit)."""
    with database.driver_connection(connect_kwargs) as conn, conn.cursor() as cur:
        if not database.table_columns(cur, table):
            cur.execute(ddl(table))
            for statement in indexes(table):
                cur.execute(statement)
        database.check_own_table(cur, table)
