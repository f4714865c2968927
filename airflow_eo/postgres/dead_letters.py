"""The dead-letter table of the PostgreSQL sinks: what ``airflow eo dead-letters`` and the DAG tab read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row

from airflow_eo.postgres.connection import connect
from airflow_eo.postgres.sql import quote_table


def read_dead_letters(connect_kwargs: Mapping[str, Any], table: str, pipeline_id: str, batch_id: int | None,
                      limit: int) -> list[dict[str, Any]] | None:
    """The pipeline's dead letters (oldest offsets first); None when the table does not exist.

    :param connect_kwargs: psycopg arguments of the sink's database.
    :param table: the dead-letter table (``table`` or ``schema.table``).
    :param pipeline_id: the pipeline.
    :param batch_id: only this batch's.
    :param limit: at most this many.
    """
    where, args = "pipeline_id = %s", list[Any]([pipeline_id])
    if batch_id is not None:
        where += " AND batch_id = %s"
        args.append(batch_id)
    conn = connect(connect_kwargs, autocommit=True, row_factory=dict_row)
    try:
        try:
            found = conn.execute(
                # Every column: a table of an older release, not written since, has no kafka_headers yet.
                f"SELECT * FROM {quote_table(table)} WHERE {where} "
                "ORDER BY batch_id, topic, kafka_partition, kafka_offset LIMIT %s", (*args, limit)).fetchall()
        except psycopg.errors.UndefinedTable:
            return None
        # bytes as MySQL's driver returns them (psycopg reads BYTEA as memoryview)
        return [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()} for row in found]
    finally:
        conn.close()
