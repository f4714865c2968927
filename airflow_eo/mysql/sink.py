"""MySQL / MariaDB sinks, driver side (``docs/architecture.md``, "Sinks"): idempotent upsert, and XA two-phase commit.

The sink is written once (:mod:`airflow_eo.sqlsink.sink`); here is what only MySQL reads of its server and table
(the server's version and ``local_infile``, the table's shape from ``information_schema``, an older dead-letter
table's collation) and its partition writer's options (bulk load, ``LOAD DATA .. REPLACE``). The prepared branches
go through the one XA API, :class:`~airflow_eo.mysql.xa.XaFacade`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pymysql
from pymysql.constants import ER

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError, UnsupportedServerError
from airflow_eo.core.identifiers import quote_table
from airflow_eo.mysql.bulk_load import staging_types
from airflow_eo.mysql.database import DATABASE, split_table
from airflow_eo.mysql.sql import (
    TABLE_VISIBILITY_PRIVILEGES,
    dead_letter_collation_upgrade,
    innodb_dictionary_name,
    keeps_prepared_xa,
    parse_server_version,
    supports_row_alias,
)
from airflow_eo.mysql.table_shape import TableShape, why_replace_is_not_upsert
from airflow_eo.mysql.writer import PartitionWriter
from airflow_eo.mysql.xa import ER_SPECIFIC_ACCESS_DENIED, XaFacade
from airflow_eo.sqlsink.dead_letters import DEAD_LETTER_UPGRADE_WAIT_S
from airflow_eo.sqlsink.sink import DEAD_LETTER_KEY, SqlTableSink, SqlTwoPhaseAdapter, SqlUpsertAdapter
from airflow_eo.sqlsink.writer import SqlPartitionWriter

log = logging.getLogger(__name__)

#: The column the server stamps with the time a dead letter was written.
DEAD_LETTER_STAMPED = "created_at"


class MySqlTableSink(SqlTableSink):
    """What both MySQL sinks add to the shared sink: the server's and the table's checks, and the bulk load.

    :param connect_kwargs: pymysql arguments of the sink's database (its Airflow ``mysql`` connection).
    :param rows_per_statement: rows per multi-row statement.
    :param bulk_load: load through a staging table when the server allows ``LOAD DATA LOCAL``.
    :param options: the shared sink's (:class:`~airflow_eo.sqlsink.sink.SqlTableSink`).
    """

    database = DATABASE
    writer_class = PartitionWriter

    def __init__(self, connect_kwargs: Mapping[str, Any], *, rows_per_statement: int, bulk_load: bool,
                 **options: Any) -> None:
        super().__init__(connect_kwargs, **options)
        self.rows_per_statement, self.wants_bulk_load = rows_per_statement, bulk_load
        self.row_alias = False
        self.bulk_load = False  # asked for, and the server allows LOAD DATA LOCAL (checked in check())
        self.shape = TableShape(columns=(), unique_keys=())  # read in check()
        # the server's, read in check(): its flavor, the connection's database, the user as information_schema's
        # GRANTEE columns name it
        self.flavor, self.current_database, self.grantee = "mysql", None, ""
        self.may_read_innodb_dictionary = True  # until the server refuses it (no PROCESS privilege, no such table)
        #: where the check read the table's foreign keys: ``INNODB_SYS_FOREIGN``, ``REFERENTIAL_CONSTRAINTS``, or
        #: None (the user cannot see every table: a referring one is taken to exist)
        self.foreign_keys_read_from: str | None = None

    # -- checks before any side effect

    def _check_target(self, conn: Any) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION(), @@local_infile, DATABASE(), CURRENT_USER()")
            row = cur.fetchone()
            assert row is not None, "SELECT VERSION() returns one row"
            self.flavor, version = parse_server_version(row[0])
            user, _, host = row[3].rpartition("@")
            self.current_database, self.grantee = row[2], f"'{user}'@'{host}'"
            self.row_alias = supports_row_alias(self.flavor, version)
            self._check_server(conn, self.flavor, version)
            self.bulk_load = bool(self.wants_bulk_load and row[1] is not None and int(row[1]))
            if self.wants_bulk_load and not self.bulk_load:
                log.info("%s: the server does not allow LOAD DATA LOCAL INFILE (local_infile=OFF); writing with "
                         "multi-row statements", self.name)
            self.table_columns, stored = self._table_columns(cur)
            self.shape = self._table_shape(cur, self._check_unique_key(cur), stored)

    def _check_server(self, conn: pymysql.connections.Connection, flavor: str, version: tuple[int, int, int]) -> None:
        """The XA sink's stricter requirements."""

    def _table_columns(self, cur: Any) -> tuple[list[str], tuple[str, ...]]:
        """The table's columns, and those a write may set (:meth:`_column_names`); refused without a key column."""
        columns, stored = self._column_names(cur)
        if not columns:
            schema, _ = split_table(self.table)
            raise ConfigurationError(
                f"{self.name}: table {self.table!r} does not exist in database "
                f"{schema or self.connect_kwargs.get('database')!r}: create it first"
            )
        self._check_key_columns(columns)
        return columns, stored

    def _column_names(self, cur: Any, name: str | None = None) -> tuple[list[str], tuple[str, ...]]:
        """Every column of table ``name`` (the sink's by default) in order, and those a write may set (generated
        columns left out: the server computes them); one read."""
        schema, table = split_table(name or self.table)
        # GENERATION_EXPRESSION: NULL (MariaDB) or '' (MySQL) unless generated; EXTRA's DEFAULT_GENERATED (MySQL 8)
        # is an expression default, a column a write sets.
        cur.execute("SELECT COLUMN_NAME, COALESCE(GENERATION_EXPRESSION, '') = '' FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                    (schema, table))
        rows = cur.fetchall()
        return [column for column, _ in rows], tuple(column for column, written in rows if written)

    def _table_shape(self, cur: Any, unique_keys: tuple[frozenset[str], ...], stored: tuple[str, ...],
                     name: str | None = None) -> TableShape:
        """What decides whether a replacing load of table ``name`` (the sink's by default; ``stored``: the columns
        a write may set) equals the upsert (:func:`why_replace_is_not_upsert`); read only. The table's triggers are
        visible only with the TRIGGER privilege: without it, they are taken to exist; foreign keys: see
        :meth:`_foreign_keys`. The privileges counted are the user's own (a user who may read the ``mysql`` database
        is shown every account's); one held through a role is not counted (the safe side)."""
        schema, table = split_table(name or self.table)
        where = "TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s"
        mine = "GRANTEE = %s AND PRIVILEGE_TYPE"
        cur.execute(
            f"SELECT (SELECT TABLE_TYPE FROM information_schema.TABLES WHERE {where}), "
            "(SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = "
            "COALESCE(%s, DATABASE()) AND EVENT_OBJECT_TABLE = %s), "
            f"(SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES WHERE {mine} = 'TRIGGER') + "
            f"(SELECT COUNT(*) FROM information_schema.SCHEMA_PRIVILEGES WHERE {mine} = 'TRIGGER' AND "
            "COALESCE(%s, DATABASE()) LIKE TABLE_SCHEMA) + "
            f"(SELECT COUNT(*) FROM information_schema.TABLE_PRIVILEGES WHERE {mine} = 'TRIGGER' AND {where}), "
            f"(SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES WHERE {mine} IN "
            f"({', '.join(['%s'] * len(TABLE_VISIBILITY_PRIVILEGES))}))",
            (schema, table, schema, table, self.grantee, self.grantee, schema, self.grantee, schema, table,
             self.grantee, *TABLE_VISIBILITY_PRIVILEGES))
        table_type, triggers, may_see_triggers, sees_every_table = cur.fetchone()
        referenced, hidden = self._foreign_keys(cur, schema, table, bool(sees_every_table))
        return TableShape(columns=stored, unique_keys=unique_keys, has_triggers=bool(triggers or not may_see_triggers),
                          referenced=referenced, foreign_keys_hidden=hidden, plain=table_type == "BASE TABLE")

    def _foreign_keys(self, cur: Any, schema: str | None, table: str, sees_every_table: bool) -> tuple[bool, bool]:
        """(another table's foreign key refers to ``schema.table``, the user cannot see every table that might).

        A referring table can be in any database, and ``information_schema`` lists only the tables the user holds a
        privilege on. MariaDB's InnoDB dictionary answers for all of them (with the PROCESS privilege), at once;
        else ``REFERENTIAL_CONSTRAINTS`` does for a user with a server-wide table privilege, who sees every table.
        Asked by the referred table, MariaDB opens every table definition of the server to answer it (with 377
        tables here, the statement that asked it took 3.4 ms of a 7.5 ms check). For any other user, a referring
        table is taken to exist."""
        database = schema or self.current_database
        dictionary_name = (innodb_dictionary_name(database, table)
                           if self.flavor == "mariadb" and database and self.may_read_innodb_dictionary else None)
        if dictionary_name is not None:
            try:
                # REF_NAME is as the REFERENCES clause wrote it; a server that folds names compares without case.
                cur.execute("SELECT COUNT(*) FROM information_schema.INNODB_SYS_FOREIGN WHERE LOWER(REF_NAME) = "
                            "LOWER(%s)", (dictionary_name,))
                self.foreign_keys_read_from = "INNODB_SYS_FOREIGN"
                return bool(cur.fetchone()[0]), False
            except pymysql.err.MySQLError as exc:
                if not exc.args or exc.args[0] not in (ER.SPECIFIC_ACCESS_DENIED_ERROR, ER.UNKNOWN_TABLE):
                    raise
                self.may_read_innodb_dictionary = False
        if not sees_every_table:
            self.foreign_keys_read_from = None
            return False, True
        # The two schemas no table can be created in are left out (MariaDB then opens none of their definitions).
        cur.execute("SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA NOT IN "
                    "('information_schema', 'performance_schema') AND UNIQUE_CONSTRAINT_SCHEMA = "
                    "COALESCE(%s, DATABASE()) AND REFERENCED_TABLE_NAME = %s", (schema, table))
        self.foreign_keys_read_from = "REFERENTIAL_CONSTRAINTS"
        return bool(cur.fetchone()[0]), False

    def _unique_keys(self, cur: Any, name: str | None = None) -> tuple[frozenset[str], ...]:
        """The columns of each PRIMARY KEY / UNIQUE index of table ``name`` (the sink's by default), by index."""
        schema, table = split_table(name or self.table)
        cur.execute(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE "
            "TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s AND NON_UNIQUE = 0", (schema, table),
        )
        indexes: dict[str, set[str]] = {}
        for index, column in cur.fetchall():
            indexes.setdefault(index, set()).add(column)
        return tuple(frozenset(columns) for columns in indexes.values())

    def _check_unique_key(self, cur: Any) -> tuple[frozenset[str], ...]:
        indexes = self._unique_keys(cur)
        if frozenset(self.key_columns) not in indexes:
            raise ConfigurationError(
                f"{self.name}: table {self.table!r} needs a PRIMARY KEY or UNIQUE index on exactly "
                f"({', '.join(self.key_columns)}) so that a replayed row overwrites instead of "
                "duplicating; add one"
            )
        return indexes

    # -- writes

    def can_hold_writes(self, out: Any) -> bool:
        """Yes when the bulk load takes every output column: a partition is staged before anything is written."""
        if not self.bulk_load:
            return False
        from pyspark.sql.pandas.types import to_arrow_schema

        return staging_types(to_arrow_schema(out.schema), out.columns) is not None

    def replaces_rows(self, columns: Sequence[str]) -> bool:
        """Whether the bulk load of ``columns`` goes straight into the table with ``LOAD DATA .. REPLACE`` (no staging
        table, no ``INSERT .. SELECT``): where that leaves what the upsert leaves (logged either way)."""
        if not self.bulk_load:
            return False
        why_not = why_replace_is_not_upsert(self.shape, columns, self.key_columns, self.updates)
        if why_not is None:
            log.info("%s: rows are bulk-loaded straight into %s with LOAD DATA .. REPLACE (replacing a row whole "
                     "equals the upsert here)", self.name, self.table)
        else:
            log.info("%s: rows are bulk-loaded into %s through a staging table: %s", self.name, self.table, why_not)
        return why_not is None

    def _writer_options(self) -> dict[str, Any]:
        return {"row_alias": self.row_alias, "rows_per_statement": self.rows_per_statement, "xa": self.two_phase,
                "bulk_load": self.bulk_load}

    def partition_writer(self, batch: BatchContext, columns: Sequence[str]) -> SqlPartitionWriter:
        self.check_columns(columns)
        return self._writer(batch, self.table, columns, self.key_columns, self.updates,
                            replace_rows=DELETE_COLUMN not in columns and self.replaces_rows(columns))

    def _seen_id_writer_options(self) -> dict[str, Any]:
        # Every column is replaced and the key is the table's one unique index: LOAD DATA .. REPLACE leaves what the
        # upsert leaves, without the staging table and its INSERT .. SELECT (measured at 1,000,000 ids: 6.6 s per
        # task of 500,000 through staging).
        return {"replace_rows": self.bulk_load}

    # -- dead letters

    def _dead_letter_writer_options(self, cur: Any, written: Sequence[str]) -> dict[str, Any]:
        # A replacing load sets created_at to its own time, as the column's default does for a new row (a replayed
        # dead letter of the upsert sink gets the replay's time; the XA sink's never existed).
        shape = self._table_shape(cur, self._unique_keys(cur, self.dead_letter_table),
                                  self._column_names(cur, self.dead_letter_table)[1], self.dead_letter_table)
        replace = self.bulk_load and why_replace_is_not_upsert(
            shape, (*written, DEAD_LETTER_STAMPED), DEAD_LETTER_KEY, {}) is None
        return {"replace_rows": replace, "stamped": (DEAD_LETTER_STAMPED,) if replace else ()}

    def _before_dead_letter_upgrade(self, cur: Any, batch: BatchContext) -> None:
        """Once per table an older release made in a case-insensitive collation: converted to byte-for-byte ids and
        topics (:data:`~airflow_eo.mysql.sql.DEAD_LETTER_COLLATION`). When it cannot be yet (another pipeline's
        prepared branch holds the table, no ALTER privilege), the batch goes on only if no two keys of it can meet:
        no other pipeline id in the table equal to ours but for case, and no two of the batch's topics alike but
        for case; else it is refused with the statement to run (the dead letters would overwrite each other)."""
        schema, table = split_table(self.dead_letter_table)
        cur.execute("SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE "
                    "TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s", (schema, table))
        statement = dead_letter_collation_upgrade(self.dead_letter_table, dict(cur.fetchall()))
        if statement is None:
            return
        cur.execute("SET SESSION lock_wait_timeout = %s", (DEAD_LETTER_UPGRADE_WAIT_S,))
        try:
            cur.execute(statement)
            log.info("%s: dead-letter table %s upgraded: %s", self.name, self.dead_letter_table, statement)
            return
        except pymysql.err.MySQLError as exc:
            why = exc.args[-1]
        topics = sorted({r.topic for r in batch.ranges})
        alike_topics = [t for t in topics if sum(t.lower() == u.lower() for u in topics) > 1]
        cur.execute(f"SELECT DISTINCT pipeline_id FROM {quote_table(self.dead_letter_table)} WHERE pipeline_id = %s",
                    (batch.pipeline_id,))
        alike_pipelines = sorted(p for (p,) in cur.fetchall() if p != batch.pipeline_id)
        if alike_topics or alike_pipelines:
            meeting = (f"pipelines {alike_pipelines} and {batch.pipeline_id!r}" if alike_pipelines
                       else f"topics {alike_topics}")
            raise ConfigurationError(
                f"{self.name}: the dead-letter table {self.dead_letter_table} compares ids and topics without case "
                f"(an older release made it so), where {meeting} would overwrite each other's dead letters, and it "
                f"could not be converted now ({why}). Run, as a user with the ALTER privilege, once no prepared XA "
                f"branch holds the table (airflow eo status shows them): {statement}")
        log.warning("%s: dead-letter table %s compares ids and topics without case and could not be converted now "
                    "(%s); nothing of this batch can meet another key there, so it goes on. Run, as a user with the "
                    "ALTER privilege: %s", self.name, self.dead_letter_table, why, statement)


class MySqlUpsertAdapter(SqlUpsertAdapter, MySqlTableSink):
    """Idempotent upsert (:class:`~airflow_eo.sqlsink.sink.SqlUpsertAdapter`) on MySQL: fenced when the offset store
    is on the same server (same host and port).

    :param store_kwargs: pymysql arguments of the offset store's connection (None: not fenced).
    """


class MySqlXaAdapter(SqlTwoPhaseAdapter, MySqlTableSink):
    """XA: one branch per Spark task, prepared, committed only after the store's commit point."""

    def _check_server(self, conn: pymysql.connections.Connection, flavor: str, version: tuple[int, int, int]) -> None:
        if not keeps_prepared_xa(flavor, version):
            raise UnsupportedServerError(
                f"{self.name}: {flavor} {'.'.join(map(str, version))} rolls back prepared XA branches when a "
                "connection closes, which breaks exactly-once; use MariaDB >= 10.5 or MySQL >= 5.7.7 "
                "(8.x recommended), or MySqlUpsertSink"
            )
        try:
            XaFacade(conn).recover()
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] == ER_SPECIFIC_ACCESS_DENIED:
                raise UnsupportedServerError(
                    f"{self.name}: user {self.connect_kwargs.get('user')!r} may not run XA RECOVER; "
                    "on MySQL 8 run: GRANT XA_RECOVER_ADMIN ON *.* TO '<user>'@'<host>'"
                ) from exc
            raise
