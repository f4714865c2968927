"""MySQL / MariaDB as the shared SQL sink and store see it: the room's one descriptor (``docs/architecture.md``,
"The recipe for a new database")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT, CR, ER

from airflow_eo.core.errors import OperationError
from airflow_eo.core.identifiers import quote_table
from airflow_eo.core.two_phase import PreparedBranches
from airflow_eo.core.value_checks import ColumnFacts, integer_range
from airflow_eo.mysql import connection, migrations, sql
from airflow_eo.mysql.xa import XaFacade
from airflow_eo.sqlsink.change_positions import change_position_table_ddl
from airflow_eo.sqlsink.database import SqlDatabase
from airflow_eo.sqlsink.seen_ids import seen_id_table_ddl

# A migration interrupted after an ALTER (DDL commits on its own) is re-run: these are "already done".
#: seconds a migration waits for another process's before it gives up
MIGRATION_LOCK_WAIT_S = 60
_ALREADY_APPLIED = {ER.TABLE_EXISTS_ERROR, ER.DUP_FIELDNAME}
# The connection is gone, or the server chose this transaction as a deadlock's victim: a retry may succeed.
_TRANSIENT = {CR.CR_SERVER_GONE_ERROR, CR.CR_SERVER_LOST, CR.CR_CONN_HOST_ERROR, ER.LOCK_DEADLOCK,
              ER.LOCK_WAIT_TIMEOUT}


class MySqlDatabase(SqlDatabase):
    """MySQL / MariaDB through pymysql (every session utf8mb4 and strict:
    :func:`~airflow_eo.mysql.connection.connect`)."""

    name = "MySQL"
    conn_type = "mysql"
    dialect = migrations.DIALECT
    branch_name = "prepared XA branch"
    spark_column_types = {"string": "LONGTEXT", "int": "INT", "bigint": "BIGINT", "smallint": "SMALLINT",
                          "tinyint": "TINYINT", "boolean": "BOOLEAN", "double": "DOUBLE", "float": "FLOAT",
                          "timestamp": "DATETIME(6)", "timestamp_ntz": "DATETIME(6)", "date": "DATE",
                          "binary": "LONGBLOB"}
    dead_letter_migrations = sql.DEAD_LETTER_MIGRATIONS
    case_insensitive_columns = True
    alter_role = "a user with the ALTER privilege"

    @property
    def migrations(self) -> Sequence[tuple[int, Sequence[str]]]:  # type: ignore[override]
        return migrations.MIGRATIONS  # read when used: a test sets an older list

    def connect(self, connect_kwargs: Mapping[str, Any], **options: Any) -> Any:
        return connection.connect(connect_kwargs, **{"charset": "utf8mb4", **options})

    def store_connection(self, connect_kwargs: Mapping[str, Any]) -> Any:
        # Affected rows = matched rows, so a compare-and-set that rewrites an unchanged value (an empty range) still
        # counts as a match. Every session reads TIMESTAMPs in UTC, whichever transaction a kept one served before.
        return connection.connect(connect_kwargs, autocommit=False, cursorclass=pymysql.cursors.DictCursor,
                                  client_flag=CLIENT.FOUND_ROWS,
                                  init_command=f"{connection.STRICT_SESSION}, time_zone = '+00:00'")

    keeps_connections = True

    def connection_alive(self, conn: Any) -> bool:
        try:
            conn.ping(reconnect=False)  # COM_PING
        except (pymysql.err.MySQLError, OSError):
            return False
        return True

    def connection_closed(self, conn: Any) -> bool:
        return not conn.open  # pymysql closes its socket on a lost connection

    def errors(self) -> tuple[type[BaseException], ...]:
        return (pymysql.err.MySQLError,)

    def describe(self, exc: BaseException) -> str:
        """pymysql's error as its message (its args are ``(code, message)``)."""
        return str(exc.args[-1]) if exc.args else str(exc)

    def _code(self, exc: BaseException) -> Any:
        return exc.args[0] if exc.args else None

    def is_duplicate_column(self, exc: BaseException) -> bool:
        return self._code(exc) == ER.DUP_FIELDNAME

    def is_missing_table(self, exc: BaseException) -> bool:
        return self._code(exc) == ER.NO_SUCH_TABLE

    def is_transient(self, exc: BaseException) -> bool:
        return self._code(exc) in _TRANSIENT

    def read_dicts(self, connect_kwargs: Mapping[str, Any], statement: str,
                   args: Sequence[Any]) -> list[dict[str, Any]]:
        conn = self.connect(connect_kwargs, autocommit=True, cursorclass=pymysql.cursors.DictCursor)
        try:
            with conn.cursor() as cur:
                cur.execute(self.dialect.utc_session)  # TIMESTAMP columns in UTC
                cur.execute(statement, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def lock_migrations(self, cur: Any) -> None:
        cur.execute("SELECT GET_LOCK('airflow_eo_migrate', %s) AS got", (MIGRATION_LOCK_WAIT_S,))
        row = cur.fetchone()
        if not row or row["got"] != 1:  # 0: timed out; NULL: an error (the session killed)
            raise OperationError(f"the offset store's migration lock (GET_LOCK('airflow_eo_migrate')) was not free "
                                 f"within {MIGRATION_LOCK_WAIT_S} s: another process is migrating the store or holds "
                                 "the lock; its session is in SHOW PROCESSLIST. Nothing was changed; run again")

    def unlock_migrations(self, cur: Any) -> None:
        cur.execute("DO RELEASE_LOCK('airflow_eo_migrate')")

    def already_applied(self, exc: BaseException) -> bool:
        return self._code(exc) in _ALREADY_APPLIED

    def quote_table(self, table: str) -> str:
        return quote_table(table)

    def add_column_statement(self, table: str, column: str, sql_type: str) -> str:
        return sql.add_column_statement(table, column, sql_type)

    def dead_letter_ddl(self, table: str) -> str:
        return sql.dead_letter_ddl(table)

    def seen_id_ddl(self, table: str) -> str:
        return seen_id_table_ddl(sql.quote_table(table), "LONGBLOB", "BINARY({n})",
                                 inline_index=", KEY eo_seen_ids_age (pipeline_key, seen_at)",
                                 table_options=f" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 "
                                               f"COLLATE={sql.DEAD_LETTER_COLLATION}")

    def change_position_ddl(self, table: str) -> str:
        return change_position_table_ddl(sql.quote_table(table), "BINARY({n})",
                                         inline_index=", KEY eo_change_markers (pipeline_key, deleted, changed_at)",
                                         table_options=" ENGINE=InnoDB")

    def purge_seen_ids(self, cur: Any, table: str, key: bytes, before_ms: int, limit: int) -> int:
        # A DELETE over a range of the age index locks the key past the range (READ COMMITTED too): the first id
        # the running batch's prepared branches inserted, so the purge that follows a batch's write waited its whole
        # lock wait (measured). The ids are read without locks, then deleted by primary key (`seen_at + 0`: not by
        # the age index), still only while seen before the cutoff (a batch may have seen one anew meanwhile).
        quoted = sql.quote_table(table)
        cur.execute(f"SELECT event_id FROM {quoted} WHERE pipeline_key = %s AND seen_at < %s LIMIT %s",
                    (key, before_ms, limit))
        ids = [row[0] for row in cur.fetchall()]
        if not ids:
            return 0
        cur.execute(f"DELETE FROM {quoted} WHERE pipeline_key = %s AND event_id IN ({', '.join(['%s'] * len(ids))}) "
                    "AND seen_at + 0 < %s", (key, *ids, before_ms))
        return int(cur.rowcount or 0)

    def table_columns(self, cur: Any, table: str) -> list[str]:
        schema, name = split_table(table)
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) "
                    "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (schema, name))
        return [row[0] for row in cur.fetchall()]

    def column_facts(self, cur: Any, table: str) -> list[ColumnFacts]:
        schema, name = split_table(table)
        cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE, IS_NULLABLE, CHARACTER_MAXIMUM_LENGTH, "
                    "CHARACTER_OCTET_LENGTH, CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA "
                    "= COALESCE(%s, DATABASE()) AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (schema, name))
        facts = []
        for column, column_type, data_type, nullable, chars, octets, charset in cur.fetchall():
            data_type = data_type.lower()
            facts.append(ColumnFacts(
                column, column_type, nullable == "YES",
                max_chars=int(chars) if data_type in ("char", "varchar") else None,
                # The TEXT types hold bytes (LONGTEXT's 4 GiB: more than a Spark string).
                max_bytes=int(octets) if data_type in ("tinytext", "text", "mediumtext") else None,
                int_range=integer_range(data_type, "unsigned" in column_type.lower()),
                charset=charset.lower() if charset else None))
        return facts

    def store_schema(self, store_kwargs: Mapping[str, Any]) -> str | None:
        return store_kwargs.get("database")

    def fence_advice(self, store_kwargs: Mapping[str, Any]) -> str:
        return (f"on the store's server are fenced by it: GRANT SELECT ON {store_kwargs.get('database')}.eo_pipeline "
                "and .eo_interval to that user")

    def lock_wait(self, seconds: int) -> str:
        return f"SET SESSION lock_wait_timeout = {int(seconds)}"

    def row_lock_wait(self, seconds: int) -> str:
        return f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}"

    @contextlib.contextmanager
    def two_phase_session(self, connect_kwargs: Mapping[str, Any]) -> Iterator[PreparedBranches]:
        with self.driver_connection(connect_kwargs) as conn:
            yield XaFacade(conn)


def split_table(table: str) -> tuple[str | None, str]:
    """``database.table`` or ``table`` → (database or None, table)."""
    parts = table.split(".")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


#: The room's descriptor.
DATABASE = MySqlDatabase()
