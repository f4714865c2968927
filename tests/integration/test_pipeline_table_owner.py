"""A pipeline table another PostgreSQL role made first (``public`` is writable by every role up to PostgreSQL 14) may
carry a trigger that runs with the pipeline's rights: the sink refuses it, naming its owner."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.postgres.database import DATABASE as POSTGRES
from airflow_eo.sinks import PostgresUpsertSink
from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE, create_seen_id_table
from tests.support.postgres import pg_rows


def test_a_seen_id_or_dead_letter_table_another_role_made_is_refused(postgres_kwargs, airflow_db):
    suffix = uuid.uuid4().hex[:8]
    pipeline_role, intruder, schema = f"eo_pipe_{suffix}", f"eo_intruder_{suffix}", f"eo_owner_{suffix}"
    password = uuid.uuid4().hex
    setup = [f"CREATE ROLE {pipeline_role} LOGIN PASSWORD '{password}'", f"CREATE ROLE {intruder}",
             f"CREATE SCHEMA {schema}", f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {pipeline_role}, {intruder}",
             f"ALTER ROLE {pipeline_role} SET search_path = {schema}"]
    for statement in setup:
        pg_rows(postgres_kwargs, statement)
    as_pipeline = {**postgres_kwargs, "user": pipeline_role, "password": password}
    try:
        create_seen_id_table(POSTGRES, as_pipeline, SEEN_ID_TABLE)  # its own: made, and used again
        create_seen_id_table(POSTGRES, as_pipeline, SEEN_ID_TABLE)
        pg_rows(postgres_kwargs, f"DROP TABLE {schema}.{SEEN_ID_TABLE}")
        # The intruder makes it first (a trigger could follow); the pipeline's user finds it by its search path.
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            conn.execute(f"SET ROLE {intruder}")
            conn.execute(f"CREATE TABLE {schema}.{SEEN_ID_TABLE} (pipeline_key BYTEA, event_id BYTEA, topic TEXT, "
                         "kafka_partition INT, kafka_offset BIGINT, seen_at BIGINT, batch_id BIGINT)")
            conn.execute(f"GRANT ALL ON {schema}.{SEEN_ID_TABLE} TO {pipeline_role}")
        with pytest.raises(ConfigurationError, match=f"the table {SEEN_ID_TABLE} belongs to role '{intruder}', not to "
                                                     "this pipeline's user"):
            create_seen_id_table(POSTGRES, as_pipeline, SEEN_ID_TABLE)

        # The dead-letter table likewise.
        sink = build_sink(PostgresUpsertSink(table="t", key_columns=["id"]), f"owner_{suffix}", "eo_offset_store")
        sink.connect_kwargs = as_pipeline  # type: ignore[attr-defined]
        batch = BatchContext(f"owner_{suffix}", 1, "run", 1, (OffsetRange("t", 0, 0, 1),))
        sink.dead_letter_writer(batch)  # type: ignore[attr-defined]  # its own: made
        dead_letters = sink.dead_letter_table  # type: ignore[attr-defined]
        pg_rows(postgres_kwargs, f"DROP TABLE {schema}.{dead_letters}")
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            conn.execute(f"SET ROLE {intruder}")
            conn.execute(f"CREATE TABLE {schema}.{dead_letters} (LIKE {schema}.{SEEN_ID_TABLE})")
        with pytest.raises(ConfigurationError, match=f"the table {dead_letters} belongs to role '{intruder}'"):
            sink.dead_letter_writer(batch)  # type: ignore[attr-defined]
    finally:
        pg_rows(postgres_kwargs, f"DROP SCHEMA {schema} CASCADE")
        pg_rows(postgres_kwargs, f"DROP ROLE {pipeline_role}")
        pg_rows(postgres_kwargs, f"DROP ROLE {intruder}")
