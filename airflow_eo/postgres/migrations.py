"""The offset store on PostgreSQL: its spellings (:data:`DIALECT`) and its versioned migrations (append only, each
statement idempotent; its own version numbers: the tables themselves are written once, ``airflow_eo/sqlstore``).

PostgreSQL compares text byte for byte under its default (deterministic) collations: ids and topics that differ in
case stay apart, as MySQL's utf8mb4_bin columns keep them.
"""

from __future__ import annotations

from airflow_eo.sqlstore.dialect import StoreDialect
from airflow_eo.sqlstore.schema import store_tables

DIALECT = StoreDialect(
    name="PostgreSQL",
    insert_ignore="INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({key}) DO NOTHING",
    increment_on_conflict=("ON CONFLICT ({key}) DO UPDATE SET epoch = {table}.epoch + 1, "
                           "taken_at = {now}"),
    share_lock="FOR SHARE",
    utc_session="SET LOCAL TIME ZONE 'UTC'",
    identifier_quote='"',
    # md5 of randomness, not gen_random_uuid(): that is built in from PostgreSQL 13 only.
    random_id="md5(random()::text || clock_timestamp()::text)",
    timestamp_type="TIMESTAMPTZ(3)",
    json_type="JSONB",
)

MIGRATIONS: list[tuple[int, list[str]]] = [
    # A new store: the tables as this release has them (written once, airflow_eo/sqlstore/schema.py). The versions
    # after 1 are what a store made by an earlier release lacks; a new store passes over them (each is idempotent).
    (1, store_tables(DIALECT)),
    (2, [
        # The owner's DAG id and task id apart (Airflow ids may hold dots: DAG "a" task "b.c" and DAG "a.b"
        # task "c" both read "a.b.c"); ``owner`` keeps the text people read.
        "ALTER TABLE eo_pipeline ADD COLUMN IF NOT EXISTS owner_dag_id VARCHAR(250) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN IF NOT EXISTS owner_task_id VARCHAR(250) NULL",
    ]),
    (3, [
        # A retired pipeline (``airflow eo retire``): its row stays as the tombstone that refuses its id's next take.
        "ALTER TABLE eo_pipeline ADD COLUMN IF NOT EXISTS retired_at TIMESTAMPTZ(3) NULL",
    ]),
    (4, [
        # The store's identity, made once: a sink database keeps which store owns a pipeline id's rows (seen ids,
        # change positions), so that two stores running one pipeline id against it are refused, not mixed.
        "CREATE TABLE IF NOT EXISTS eo_store_identity (id INT NOT NULL PRIMARY KEY, identity VARCHAR(64) NOT NULL)",
        # md5 of randomness, not gen_random_uuid(): that is built in from PostgreSQL 13 only.
        "INSERT INTO eo_store_identity (id, identity) VALUES (1, md5(random()::text || clock_timestamp()::text)) "
        "ON CONFLICT DO NOTHING",
    ]),
]
