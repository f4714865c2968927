"""The dead-letter table of the MySQL sinks: what ``airflow eo dead-letters`` and the DAG tab read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pymysql

from airflow_eo.core.identifiers import quote_table
from airflow_eo.mysql.connection import connect

ER_NO_SUCH_TABLE = 1146


def read_dead_letters(connect_kwargs: Mapping[str, Any], table: str, pipeline_id: str, batch_id: int | None,
                      limit: int) -> list[dict[str, Any]] | None:
    """The pipeline's dead letters (oldest offsets first); None when the table does not exist.

    :param connect_kwargs: pymysql arguments of the sink's database.
    :param table: the dead-letter table (``table`` or ``database.table``).
    :param pipeline_id: the pipeline.
    :param batch_id: only this batch's.
    :param limit: at most this many.
    """
    where, args = "pipeline_id = %s", list[Any]([pipeline_id])
    if batch_id is not None:
        where += " AND batch_id = %s"
        args.append(batch_id)
    conn = connect(connect_kwargs, autocommit=True, charset="utf8mb4",
                                    cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")  # created_at (TIMESTAMP) in UTC
            try:
                # Every column: a table of an older release, not written since, has no kafka_headers yet.
                cur.execute(f"SELECT * FROM {quote_table(table)} WHERE {where} "
                            "ORDER BY batch_id, topic, kafka_partition, kafka_offset LIMIT %s", (*args, limit))
            except pymysql.err.ProgrammingError as exc:
                if exc.args and exc.args[0] == ER_NO_SUCH_TABLE:
                    return None
                raise
            # Byte for byte: a table an older release made compares ids without case ("p" would read "P"'s).
            return [row for row in cur.fetchall() if row["pipeline_id"] == pipeline_id]
    finally:
        conn.close()
