"""PostgreSQL as the shared SQL sink and store see it: the room's one descriptor (``docs/architecture.md``, "The
recipe for a new database")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.two_phase import PreparedBranches
from airflow_eo.core.value_checks import ColumnFacts, integer_range
from airflow_eo.postgres import connection, migrations, sql
from airflow_eo.postgres.prepared import PreparedTransactions
from airflow_eo.sqlsink.change_positions import change_position_table_ddl
from airflow_eo.sqlsink.database import SqlDatabase
from airflow_eo.sqlsink.seen_ids import seen_id_table_ddl

# Any 64-bit key; one per purpose (pg_advisory_xact_lock): serializes two DAGs migrating at once.
MIGRATION_LOCK = 0x616972666C6F77  # "airflow"


class PostgresDatabase(SqlDatabase):
    """PostgreSQL through psycopg 3 (every session in UTC, JSON read as text:
    :func:`~airflow_eo.postgres.connection.connect`)."""

    name = "PostgreSQL"
    conn_type = "postgres"
    refuses_nul_in_text = True
    dialect = migrations.DIALECT
    branch_name = "prepared transaction"
    spark_column_types = {"string": "TEXT", "int": "INTEGER", "bigint": "BIGINT", "smallint": "SMALLINT",
                          "tinyint": "SMALLINT", "boolean": "BOOLEAN", "double": "DOUBLE PRECISION", "float": "REAL",
                          "timestamp": "TIMESTAMPTZ", "timestamp_ntz": "TIMESTAMP", "date": "DATE", "binary": "BYTEA"}
    decimal_type = "NUMERIC({precision},{scale})"
    dead_letter_migrations = sql.DEAD_LETTER_MIGRATIONS
    key_binary = "BYTEA"
    alter_role = "the table's owner"
    location_keys = ("host", "port", "dbname")

    @property
    def migrations(self) -> Sequence[tuple[int, Sequence[str]]]:  # type: ignore[override]
        return migrations.MIGRATIONS  # read when used: a test sets an older list

    def connect(self, connect_kwargs: Mapping[str, Any], **options: Any) -> Any:
        return connection.connect(connect_kwargs, **options)

    def store_connection(self, connect_kwargs: Mapping[str, Any]) -> Any:
        # READ COMMITTED: every statement sees what committed before it, as the compare-and-sets after the fence's
        # lock need; psycopg counts matched rows.
        return connection.connect(connect_kwargs, autocommit=False, row_factory=dict_row)

    keeps_connections = True

    def connection_alive(self, conn: Any) -> bool:
        # An empty query in autocommit mode: a round trip that opens no transaction (psycopg_pool's check).
        try:
            autocommit, conn.autocommit = conn.autocommit, True
            try:
                conn.execute("")
            finally:
                conn.autocommit = autocommit
        except (psycopg.Error, OSError):
            return False
        return True

    def connection_closed(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def errors(self) -> tuple[type[BaseException], ...]:
        return (psycopg.Error,)

    def where(self, connect_kwargs: Mapping[str, Any]) -> str:
        return f"{connect_kwargs.get('host')}:{connect_kwargs.get('port')}/{connect_kwargs.get('dbname')}"

    def is_missing_table(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UndefinedTable)

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, (psycopg.OperationalError, psycopg.errors.DeadlockDetected,
                                psycopg.errors.SerializationFailure))

    def is_privilege_error(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.InsufficientPrivilege)

    def read_dicts(self, connect_kwargs: Mapping[str, Any], statement: str,
                   args: Sequence[Any]) -> list[dict[str, Any]]:
        conn = self.connect(connect_kwargs, autocommit=True, row_factory=dict_row)
        try:
            found = conn.execute(statement, args).fetchall()
        finally:
            conn.close()
        # bytes as MySQL's driver returns them (psycopg reads BYTEA as memoryview)
        return [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()} for row in found]

    def lock_migrations(self, cur: Any) -> None:
        # Transaction-scoped: PostgreSQL's DDL is transactional, a migration is applied whole or not at all.
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))

    def quote_table(self, table: str) -> str:
        return sql.quote_table(table)

    def add_column_statement(self, table: str, column: str, sql_type: str) -> str:
        return sql.add_column_statement(table, column, sql_type)

    def dead_letter_ddl(self, table: str) -> str:
        return sql.dead_letter_ddl(table)

    def one_of(self, column: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        # One array parameter: the server parses and plans a statement of 5,000 ids 2-3x faster than 5,000
        # parameters (200,000 ids against 1,000,000: 3.6-3.8 s as IN (..), 1.1-2.0 s as = ANY).
        return f"{column} = ANY(%s)", (list(values),)

    def seen_id_ddl(self, table: str) -> str:
        return seen_id_table_ddl(sql.quote_table(table), "BYTEA", "BYTEA")

    def seen_id_indexes(self, table: str) -> list[str]:
        _, name = sql.split_table(table)
        return [f"CREATE INDEX IF NOT EXISTS {sql.quote_identifier(name + '_age')} ON {sql.quote_table(table)} "
                "(pipeline_key, seen_at)"]

    def change_position_ddl(self, table: str) -> str:
        return change_position_table_ddl(sql.quote_table(table), "BYTEA")

    def change_position_indexes(self, table: str) -> list[str]:
        _, name = sql.split_table(table)
        return [f"CREATE INDEX IF NOT EXISTS {sql.quote_identifier(name + '_markers')} ON {sql.quote_table(table)} "
                "(pipeline_key, deleted, changed_at)"]

    def purge_seen_ids(self, cur: Any, table: str, key: bytes, before_ms: int, limit: int) -> int:
        # A delete locks only the rows it deletes here: one statement.
        quoted = sql.quote_table(table)
        cur.execute(f"DELETE FROM {quoted} WHERE ctid IN (SELECT ctid FROM {quoted} WHERE pipeline_key = %s "
                    "AND seen_at < %s LIMIT %s)", (key, before_ms, limit))
        return int(cur.rowcount or 0)

    def table_columns(self, cur: Any, table: str) -> list[str]:
        cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum", (sql.quote_table(table),))
        return [row[0] for row in cur.fetchall()]

    def check_own_table(self, cur: Any, table: str) -> None:
        """Refuse ``table`` unless this connection's user has its owner's rights: a role that could create it first
        (``public`` is writable by every role up to PostgreSQL 14) could have added a trigger, which runs with the
        rights of the user whose statement fires it."""
        cur.execute("SELECT pg_get_userbyid(c.relowner), pg_has_role(current_user, c.relowner, 'USAGE') "
                    "FROM pg_class c WHERE c.oid = to_regclass(%s)", (sql.quote_table(table),))
        row = cur.fetchone()
        if row is not None and not row[1]:
            raise ConfigurationError(
                f"the table {table} belongs to role {row[0]!r}, not to this pipeline's user: a table another role "
                "made may carry a trigger that runs with the pipeline's rights. Drop it (the pipeline makes it "
                f"again), or make this user its owner (ALTER TABLE ... OWNER TO) or a member of {row[0]!r}")

    def column_facts(self, cur: Any, table: str) -> list[ColumnFacts]:
        # atttypmod of varchar(n) and char(n) is n + 4 (the varlena header).
        cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, t.typname, "
                    "CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4 THEN a.atttypmod - 4 END "
                    "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = to_regclass(%s) "
                    "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", (sql.quote_table(table),))
        return [ColumnFacts(name, shown, bool(nullable), max_chars=chars, int_range=integer_range(type_name))
                for name, shown, nullable, type_name, chars in cur.fetchall()]

    def fence_advice(self, store_kwargs: Mapping[str, Any]) -> str:
        return "in the store's database are fenced by it: GRANT SELECT ON eo_pipeline, eo_interval TO that user"

    def lock_wait(self, seconds: int) -> str:
        return f"SET lock_timeout = '{int(seconds)}s'"

    @contextlib.contextmanager
    def two_phase_session(self, connect_kwargs: Mapping[str, Any]) -> Iterator[PreparedBranches]:
        with self.driver_connection(connect_kwargs) as conn:
            yield PreparedTransactions(conn)


#: The room's descriptor.
DATABASE = PostgresDatabase()
