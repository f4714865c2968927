"""The offset store's tables, written once: :func:`store_tables` spells them for one database through its
:class:`~airflow_eo.sqlstore.dialect.StoreDialect` (column types, table options, where indexes go).

A room's migrations start with these statements (a new store is created as this release has it) and go on with
the steps an older store of that database still lacks: those stay the room's own, because the stores already
deployed on each database have climbed their own versions. Every step is idempotent, so a new store passes over
them.
"""

from __future__ import annotations

from airflow_eo.sqlstore.dialect import StoreDialect

# (table, columns and constraints, indexes: (name, columns)). {ts}: an instant to the millisecond; {utc}: a naive UTC
# date-time (interval bounds: no 2038 limit, no session time-zone conversion); {json}; {now}: the column's default.
_TABLES: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("eo_pipeline", """
        pipeline_id VARCHAR(190) NOT NULL PRIMARY KEY,
        epoch BIGINT NOT NULL,
        created_at {ts} NOT NULL DEFAULT {now},
        taken_at {ts} NOT NULL DEFAULT {now},
        owner VARCHAR(250) NULL,
        mode VARCHAR(16) NULL,
        sink_kind VARCHAR(64) NULL,
        sink_accumulating BOOLEAN NULL,
        dead_letter_table VARCHAR(130) NULL,
        sink {json} NULL,
        owner_dag_id VARCHAR(250) NULL,
        owner_task_id VARCHAR(250) NULL,
        retired_at {ts} NULL""", ()),
    ("eo_batch", """
        pipeline_id VARCHAR(190) NOT NULL,
        batch_id BIGINT NOT NULL,
        run_id VARCHAR(250) NOT NULL,
        run_key VARCHAR(250) NULL,
        interval_start {utc} NULL,
        interval_end {utc} NULL,
        epoch BIGINT NOT NULL,
        state VARCHAR(16) NOT NULL,
        ranges {json} NOT NULL,
        skipped {json} NULL,
        xids {json} NULL,
        records_in BIGINT NULL,
        rows_out BIGINT NULL,
        dead_letters BIGINT NULL,
        summary {json} NULL,
        created_at {ts} NOT NULL DEFAULT {now},
        updated_at {ts} NOT NULL DEFAULT {now},
        committed_at {ts} NULL,
        PRIMARY KEY (pipeline_id, batch_id),
        CONSTRAINT eo_batch_run UNIQUE (pipeline_id, run_key),
        CONSTRAINT eo_batch_interval UNIQUE (pipeline_id, interval_start, interval_end)""",
     (("eo_batch_state", "pipeline_id, state"),)),
    ("eo_offset", """
        pipeline_id VARCHAR(190) NOT NULL,
        topic VARCHAR(249) NOT NULL,
        kafka_partition INT NOT NULL,
        next_offset BIGINT NOT NULL,
        batch_id BIGINT NOT NULL,
        PRIMARY KEY (pipeline_id, topic, kafka_partition)""", ()),
    ("eo_interval", """
        pipeline_id VARCHAR(190) NOT NULL,
        interval_start {utc} NOT NULL,
        interval_end {utc} NOT NULL,
        epoch BIGINT NOT NULL,
        taken_at {ts} NOT NULL DEFAULT {now},
        PRIMARY KEY (pipeline_id, interval_start, interval_end)""", ()),
    ("eo_audit", """
        audit_id {identity},
        pipeline_id VARCHAR(190) NOT NULL,
        created_at {ts} NOT NULL DEFAULT {now},
        actor VARCHAR(250) NOT NULL,
        action VARCHAR(32) NOT NULL,
        reason TEXT NULL,
        epoch BIGINT NULL,
        details {json} NULL""", (("eo_audit_pipeline", "pipeline_id, audit_id"),)),
    # The store's identity, made once: a sink database keeps which store owns a pipeline id's rows (seen ids,
    # change positions), so that two stores running one pipeline id against it are refused, not mixed.
    ("eo_store_identity", """
        id INT NOT NULL PRIMARY KEY,
        identity VARCHAR(64) NOT NULL""", ()),
)


def store_tables(dialect: StoreDialect) -> list[str]:
    """The statements that create the store's tables (and its identity row) on ``dialect``'s database, each
    idempotent."""
    types = {"ts": dialect.timestamp_type, "utc": dialect.utc_datetime_type, "json": dialect.json_type,
             "identity": dialect.identity_column, "now": dialect.now}
    statements = []
    for table, columns, indexes in _TABLES:
        body = columns.format(**types)
        if dialect.inline_indexes:
            body += "".join(f",\n        KEY {name} ({on})" for name, on in indexes)
        statements.append(f"CREATE TABLE IF NOT EXISTS {table} ({body}\n){dialect.table_options}")
        if not dialect.inline_indexes:
            statements += [f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({on})" for name, on in indexes]
    statements.append(dialect.insert_ignoring("eo_store_identity", ("id", "identity"), ("id",),
                                              ("1", dialect.random_id)))
    return statements
