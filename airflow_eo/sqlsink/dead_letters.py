"""The dead-letter table of the SQL sinks: what ``airflow eo dead-letters`` and the DAG tab read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_eo.sqlsink.database import SqlDatabase


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
