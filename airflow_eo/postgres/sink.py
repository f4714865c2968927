"""PostgreSQL sinks, driver side (``docs/architecture.md``, "Sinks"): idempotent upsert, and two-phase commit with
``PREPARE TRANSACTION``.

The sink is written once (:mod:`airflow_eo.sqlsink.sink`); here is what only PostgreSQL reads of its server and table
(the catalog's columns, unique indexes and privileges, ``max_prepared_transactions``, the schema's CREATE privilege
the two-phase writer's staging table needs). Prepared transactions go through the one two-phase API,
:class:`~airflow_eo.postgres.prepared.PreparedTransactions`.
"""

from __future__ import annotations

from typing import Any

import psycopg

from airflow_eo.core.errors import ConfigurationError, UnsupportedServerError
from airflow_eo.postgres.database import DATABASE
from airflow_eo.postgres.prepared import max_prepared_transactions
from airflow_eo.postgres.sql import quote_identifier, quote_table, split_table
from airflow_eo.postgres.writer import PartitionWriter
from airflow_eo.sqlsink.sink import SqlTableSink, SqlTwoPhaseAdapter, SqlUpsertAdapter


class PostgresTableSink(SqlTableSink):
    """What both PostgreSQL sinks add to the shared sink: the catalog's checks of the target table.

    :param connect_kwargs: psycopg arguments of the sink's database (its Airflow ``postgres`` connection).
    :param options: the shared sink's (:class:`~airflow_eo.sqlsink.sink.SqlTableSink`).
    """

    database = DATABASE
    writer_class = PartitionWriter

    def _where(self) -> str:
        return self.database.where(self.connect_kwargs)

    # -- checks before any side effect

    def _check_target(self, conn: psycopg.Connection[Any]) -> None:
        """The server, the table, its unique key, the privileges; reads only."""
        self._check_server(conn)
        quoted = quote_table(self.table)
        row = conn.execute("SELECT to_regclass(%s)::oid, current_user", (quoted,)).fetchone()
        assert row is not None
        relid, user = row
        if relid is None:
            raise ConfigurationError(
                f"{self.name}: table {self.table!r} does not exist in database {self._where()} (names are "
                "case-sensitive, as quoted: a table created without quotes has a lower-case name): create it first")
        self.table_columns = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", (relid,)).fetchall()]
        self._check_key_columns(self.table_columns)
        uniques = conn.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL "
            "AND i.indexprs IS NULL GROUP BY i.indexrelid", (relid,)).fetchall()
        if set(self.key_columns) not in [set(r[0]) for r in uniques]:
            raise ConfigurationError(
                f"{self.name}: table {self.table!r} needs a PRIMARY KEY or UNIQUE constraint on exactly "
                f"({', '.join(self.key_columns)}) so that a replayed row overwrites instead of duplicating "
                f"(INSERT .. ON CONFLICT needs it); add one: ALTER TABLE {quoted} ADD UNIQUE "
                f"({', '.join(quote_identifier(k) for k in self.key_columns)})")
        privileges = conn.execute("SELECT has_table_privilege(%s, 'INSERT'), has_table_privilege(%s, 'UPDATE'), "
                                  "has_table_privilege(%s, 'SELECT')", (relid, relid, relid)).fetchone()
        if privileges is None or not all(privileges):
            raise ConfigurationError(f"{self.name}: user {user!r} may not write table {self.table!r}: "
                                     f"GRANT SELECT, INSERT, UPDATE ON {quoted} TO {quote_identifier(user)}")
        self._check_table(conn, user)

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        """The two-phase sink's requirements of the server."""

    def _check_table(self, conn: psycopg.Connection[Any], user: str) -> None:
        """The two-phase sink's requirements of the table's schema."""

    # -- writes

    def can_hold_writes(self, out: Any) -> bool:
        """Yes: every partition is staged (COPY into the session's table) before anything is written."""
        return not self.two_phase

    def _writer_options(self) -> dict[str, Any]:
        return {"two_phase": self.two_phase}


class PostgresUpsertAdapter(SqlUpsertAdapter, PostgresTableSink):
    """Idempotent upsert (:class:`~airflow_eo.sqlsink.sink.SqlUpsertAdapter`) on PostgreSQL: each Spark task commits
    its own insert, fenced (``FOR SHARE`` of the pipeline's epoch) when the offset store lives in the same database
    (same host, port and database).

    :param store_kwargs: psycopg arguments of the offset store's ``postgres`` connection (None: not fenced).
    """


class PostgresTwoPhaseAdapter(SqlTwoPhaseAdapter, PostgresTableSink):
    """Two-phase commit: one prepared transaction per Spark task, committed only after the store's commit point."""

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        if max_prepared_transactions(conn) < 1:
            raise UnsupportedServerError(two_phase_disabled_message(self.name, self._where()))

    def _check_table(self, conn: psycopg.Connection[Any], user: str) -> None:
        schema, _ = split_table(self.table)
        row = conn.execute("SELECT s, has_schema_privilege(s, 'CREATE') FROM (SELECT COALESCE(%s, current_schema()) "
                           "AS s) AS t", (schema,)).fetchone()
        if row is None or not row[1]:
            name = row[0] if row else schema
            raise ConfigurationError(
                f"{self.name}: user {user!r} may not create tables in schema {name!r}, where each Spark task "
                f"stages its rows inside its prepared transaction (a TEMP table cannot be used in one): "
                f"GRANT CREATE ON SCHEMA {quote_identifier(name) if name else '<schema>'} TO "
                f"{quote_identifier(user)}")


def two_phase_disabled_message(name: str, where: str) -> str:
    return (f"{name}: the PostgreSQL server at {where} has max_prepared_transactions = 0, so PREPARE TRANSACTION "
            "fails; set max_prepared_transactions (postgresql.conf) to at least the pipeline's Spark write tasks + 1 "
            "(e.g. 100) and restart the server, or use PostgresUpsertSink")
