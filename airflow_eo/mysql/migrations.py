"""The offset store on MySQL / MariaDB: its spellings (:data:`DIALECT`) and its versioned migrations (append only,
each statement idempotent; the tables themselves are written once, ``airflow_eo/sqlstore``)."""

from __future__ import annotations

from airflow_eo.sqlstore.dialect import StoreDialect
from airflow_eo.sqlstore.schema import store_tables

DIALECT = StoreDialect(
    name="MySQL",
    insert_ignore="INSERT IGNORE INTO {table} ({columns}) VALUES ({values})",
    increment_on_conflict="ON DUPLICATE KEY UPDATE epoch = epoch + 1, taken_at = {now}",
    share_lock="LOCK IN SHARE MODE",
    utc_session="SET time_zone = '+00:00'",
    identifier_quote="`",
    random_id="UUID()",
    utc_datetime_type="DATETIME(3)",
    identity_column="BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
    # Ids and topics compared byte for byte: under a server's default collation (often case-insensitive) pipelines
    # "p" and "P", or topics "Orders" and "orders", would share rows.
    table_options=" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    inline_indexes=True,
    # The table of parameters is read first, each of its rows then finds its row by the primary key: else MariaDB may
    # plan a scan of the index, which at REPEATABLE READ locks every pipeline's rows it reads (EXPLAIN: type index).
    update_from="UPDATE {rows} STRAIGHT_JOIN {table} AS o FORCE INDEX (PRIMARY) ON {match} SET {assign} WHERE {where}",
    values_table=False,
    # A later row's text takes the first row's collation in a UNION.
    exact_text="CONVERT(%s USING utf8mb4) COLLATE utf8mb4_bin",
)

# Versioned migrations: (version, statements). Append only; each statement is idempotent.
MIGRATIONS: list[tuple[int, list[str]]] = [
    # A new store: the tables as this release has them (written once, airflow_eo/sqlstore/schema.py). The versions
    # after 1 are what a store made by an earlier release lacks; a new store passes over them (each is idempotent).
    (1, store_tables(DIALECT)),
    (2, [
        # Who runs the pipeline (``<dag_id>.<task_id>``) and in which mode: a second DAG
        # declaring the same pipeline id is refused instead of splitting its offsets.
        "ALTER TABLE eo_pipeline ADD COLUMN owner VARCHAR(250) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN mode VARCHAR(16) NULL",
        # Interval bounds are UTC; DATETIME has no 2038 limit and no session time-zone conversion.
        "ALTER TABLE eo_batch MODIFY interval_start DATETIME(3) NULL, MODIFY interval_end DATETIME(3) NULL",
        # Interval mode fences per interval, so a backfill's concurrent runs don't fence each other.
        """CREATE TABLE IF NOT EXISTS eo_interval (
            pipeline_id VARCHAR(190) NOT NULL,
            interval_start DATETIME(3) NOT NULL,
            interval_end DATETIME(3) NOT NULL,
            epoch BIGINT NOT NULL,
            taken_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            PRIMARY KEY (pipeline_id, interval_start, interval_end)
        ) ENGINE=InnoDB""",
    ]),
    (3, [
        # The sink, recorded at every take, so that operations (``airflow eo``) know it without the DAG:
        # whether a rewind would double count, where dead letters go, how to rebuild it for recovery.
        "ALTER TABLE eo_pipeline ADD COLUMN sink_kind VARCHAR(64) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN sink_accumulating BOOLEAN NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN dead_letter_table VARCHAR(130) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN sink JSON NULL",
        # What people did to a pipeline (rewinds, recoveries): who, when, why, and what changed.
        """CREATE TABLE IF NOT EXISTS eo_audit (
            audit_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            pipeline_id VARCHAR(190) NOT NULL,
            created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            actor VARCHAR(250) NOT NULL,
            action VARCHAR(32) NOT NULL,
            reason TEXT NULL,
            epoch BIGINT NULL,
            details JSON NULL,
            KEY eo_audit_pipeline (pipeline_id, audit_id)
        ) ENGINE=InnoDB""",
    ]),
    (4, [
        # The owner's DAG id and task id apart (Airflow ids may hold dots: DAG "a" task "b.c" and DAG "a.b"
        # task "c" both read "a.b.c"); ``owner`` keeps the text people read.
        "ALTER TABLE eo_pipeline ADD COLUMN owner_dag_id VARCHAR(250) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN owner_task_id VARCHAR(250) NULL",
        # Ids and topics compared byte for byte: under the server's default collation (often case-insensitive,
        # e.g. latin1_swedish_ci) pipelines "p" and "P", or topics "Orders" and "orders", shared rows.
        # Idempotent: converting a converted table changes nothing.
        *[f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
          for table in ("eo_pipeline", "eo_batch", "eo_offset", "eo_interval", "eo_audit")],
    ]),
    (5, [
        # A retired pipeline (``airflow eo retire``): its row stays as the tombstone that refuses its id's next take.
        "ALTER TABLE eo_pipeline ADD COLUMN retired_at TIMESTAMP(3) NULL",
    ]),
    (6, [
        # The store's identity, made once: a sink database keeps which store owns a pipeline id's rows (seen ids,
        # change positions), so that two stores running one pipeline id against it are refused, not mixed.
        "CREATE TABLE IF NOT EXISTS eo_store_identity (id INT NOT NULL PRIMARY KEY, identity VARCHAR(64) NOT NULL) "
        "ENGINE=InnoDB",
        "INSERT IGNORE INTO eo_store_identity (id, identity) VALUES (1, UUID())",
    ]),
]
