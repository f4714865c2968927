"""Which offset store owns a pipeline id's rows in a SQL sink's database (the seen ids of ``dedup_key``, the change
positions of ``changes=``, keyed by the pipeline's 8-byte key): claimed by the first batch that writes such rows,
checked by every batch after it, on the driver before any branch starts.

Two offset stores running one pipeline id against one database (two Airflow deployments, a store moved without its
rows) would take each other's rows for their own: a copy dropped that was never written, a change skipped as older.
The second store is refused instead. The row keeps the pipeline id too: two ids whose 8-byte keys collide are
refused the same way, not mixed. ``airflow eo retire`` frees the id (the row goes with the pipeline's other rows);
``rename`` moves it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.sqlsink.database import SqlDatabase
from airflow_eo.sqlsink.pipeline_tables import create_if_missing

#: The table's name, in the sink's database (the connection's default schema).
OWNER_TABLE = "eo_pipeline_owners"


def owner_table_ddl(database: SqlDatabase, table: str) -> str:
    return (f"CREATE TABLE IF NOT EXISTS {database.quote_table(table)} ("
            f"pipeline_key {database.key_binary.format(n=8)} NOT NULL PRIMARY KEY, pipeline_id VARCHAR(250) NOT NULL, "
            "store_identity VARCHAR(64) NOT NULL)")


def claim_pipeline_rows(database: SqlDatabase, connect_kwargs: Mapping[str, Any], pipeline_id: str,
                        store_identity: str) -> None:
    """Record that the store ``store_identity`` owns ``pipeline_id``'s rows here, or check that it does.

    :raises ConfigurationError: another store owns them, or another pipeline id has the same key.
    """
    if not store_identity:  # a batch context made without a store (tests of a sink alone)
        return
    create_if_missing(database, connect_kwargs, OWNER_TABLE, lambda t: owner_table_ddl(database, t), lambda t: [])
    key, quoted = seen_pipeline_key(pipeline_id), database.quote_table(OWNER_TABLE)
    with database.driver_connection(connect_kwargs) as conn, conn.cursor() as cur:
        owner = _owner(cur, quoted, key)
        if owner is None:
            try:
                cur.execute(f"INSERT INTO {quoted} (pipeline_key, pipeline_id, store_identity) VALUES (%s, %s, %s)",
                            (key, pipeline_id, store_identity))
            except database.errors():  # claimed by another batch meanwhile: what it wrote is read below
                pass
            owner = _owner(cur, quoted, key)
    if owner is None:
        raise ConfigurationError(f"pipeline {pipeline_id!r}: could not record its owner in {OWNER_TABLE} on "
                                 f"{database.name}")
    owned_id, owned_by = owner
    if owned_id != pipeline_id:
        raise ConfigurationError(
            f"pipeline {pipeline_id!r}: its rows' 8-byte key in {database.name} ({OWNER_TABLE}) is pipeline "
            f"{owned_id!r}'s too: the two would read each other's seen ids and change positions. Give one of them "
            "another pipeline_id")
    if owned_by != store_identity:
        raise ConfigurationError(
            f"pipeline {pipeline_id!r}: its seen ids and change positions in {database.name} belong to a pipeline of "
            f"the same id in another offset store (store {owned_by}; this one is {store_identity}): two deployments "
            "running one pipeline id against one database would drop each other's events as copies and skip each "
            "other's changes. Give one of them another pipeline_id, or `airflow eo retire` the other one (its rows "
            "here go with it)")


def _owner(cur: Any, quoted: str, key: bytes) -> tuple[str, str] | None:
    cur.execute(f"SELECT pipeline_id, store_identity FROM {quoted} WHERE pipeline_key = %s", (key,))
    row = cur.fetchone()
    if row is None:
        return None
    values = tuple(row.values()) if isinstance(row, Mapping) else tuple(row)
    return str(values[0]), str(values[1])
