"""A toy database room, written as ``docs/architecture.md`` ("The recipe for a new database") says, in one file:
SQLite (the standard library's ``sqlite3``) as a third SQL database, so that a test checks the recipe.

What a real room splits over its folder is here together: the descriptor (:class:`ToyDatabase`), the partition writer
(:class:`ToyWriter`), the two-phase session (:class:`ToyPreparedBranches`: SQLite has no prepared transactions, so a
branch is held in this process, which is enough to run the shared two-phase adapter), the two sink specs and
adapters, and their registration (:func:`register`). Nothing of :mod:`airflow_eo.sqlsink` is copied.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.drivers import Driver, register_driver
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_identifier
from airflow_eo.core.sink_kinds import SinkAsset, register_sink
from airflow_eo.core.stores import register_store
from airflow_eo.core.two_phase import PreparedBranches
from airflow_eo.core.xid import Xid
from airflow_eo.sqlsink.database import SqlDatabase, dead_letter_table_ddl
from airflow_eo.sqlsink.sink import SqlTableSink, SqlTwoPhaseAdapter, SqlUpsertAdapter
from airflow_eo.sqlsink.specs import SqlTableSinkSpec, table_sink_factory, two_phase_capabilities, upsert_capabilities
from airflow_eo.sqlsink.writer import SqlPartitionWriter, nonempty, rollback_earlier_attempts
from airflow_eo.sqlstore.dialect import StoreDialect
from airflow_eo.sqlstore.schema import store_tables
from airflow_eo.sqlstore.store import SqlOffsetStore

CONN_TYPE = "toysql"

# -- identifiers and statements (a room's sql.py)


def quote_identifier(name: str, what: str = "identifier") -> str:
    return f'"{validate_identifier(name, what)}"'


def quote_table(table: str) -> str:
    return ".".join(quote_identifier(part, "table name") for part in table.split("."))


def upsert_statement(table: str, columns: Sequence[str], key_columns: Sequence[str], updates: Mapping[str, str]) -> str:
    quoted = [quote_identifier(c) for c in columns]
    sets = [f"{q} = {q} + excluded.{q}" if updates.get(c) == "add" else f"{q} = excluded.{q}"
            for c, q in zip(columns, quoted, strict=True) if c not in key_columns]
    action = f"DO UPDATE SET {', '.join(sets)}" if sets else "DO NOTHING"
    return (f"INSERT INTO {quote_table(table)} ({', '.join(quoted)}) VALUES ({', '.join(['%s'] * len(columns))}) "
            f"ON CONFLICT ({', '.join(quote_identifier(k) for k in key_columns)}) {action}")


# -- connections (a room's connection.py): sqlite3 with the DB-API shape the shared code uses


class _Cursor:
    """sqlite3's cursor as a context manager taking ``%s`` placeholders."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur

    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cur.close()

    def execute(self, statement: str, args: Sequence[Any] = ()) -> _Cursor:
        self._cur.execute(statement.replace("%s", "?"), tuple(args))
        return self

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount


def _timestamp(text: bytes) -> datetime:
    return datetime.fromisoformat(text.decode())


class _Connection:
    """``timestamps``: columns declared ``TIMESTAMP`` read as (naive, UTC) datetimes, as the store's are read on
    a server."""

    def __init__(self, path: str, autocommit: bool, dicts: bool, timestamps: bool = False) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None if autocommit else "DEFERRED",
                                     detect_types=sqlite3.PARSE_DECLTYPES if timestamps else 0)
        if dicts:
            self._conn.row_factory = lambda cur, row: {d[0]: v for d, v in zip(cur.description, row, strict=True)}

    def cursor(self) -> _Cursor:
        return _Cursor(self._conn.cursor())

    def commit(self) -> None:
        self._conn.commit()

    def rollback(self) -> None:
        self._conn.rollback()

    def close(self) -> None:
        self._conn.close()


sqlite3.register_converter("TIMESTAMP", _timestamp)  # for the connections that ask (PARSE_DECLTYPES)


def connect_kwargs(info: ConnectionInfo) -> dict[str, Any]:
    """The database file is the connection's schema."""
    return {"path": info.schema or ":memory:"}


# -- two-phase session (a room's xa.py / prepared.py)

#: Prepared branches by database file: (table, columns, key columns, updates, rows) to apply on commit.
_PREPARED: dict[str, dict[Xid, tuple[str, tuple[str, ...], tuple[str, ...], dict[str, str], list[tuple]]]] = {}


class ToyPreparedBranches:
    """Branches prepared in this process, committed into the database file (what XA / PREPARE TRANSACTION keep
    on a server)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.branches = _PREPARED.setdefault(path, {})

    def prepare(self, xid: Xid, table: str, columns: tuple[str, ...], key_columns: tuple[str, ...],
                updates: dict[str, str], rows: list[tuple]) -> None:
        self.branches[xid] = (table, columns, key_columns, updates, rows)

    def recover(self, pipeline_id: str | None = None) -> list[Xid]:
        return sorted(x for x in self.branches if pipeline_id is None or x.belongs_to(pipeline_id))

    def commit(self, xid: Xid) -> bool:
        branch = self.branches.pop(xid, None)
        if branch is None:
            return False
        table, columns, key_columns, updates, rows = branch
        conn = DATABASE.connect({"path": self.path}, autocommit=False)
        try:
            with conn.cursor() as cur:
                for row in rows:
                    cur.execute(upsert_statement(table, columns, key_columns, updates), row)
            conn.commit()
        finally:
            conn.close()
        return True

    def rollback(self, xid: Xid) -> bool:
        return self.branches.pop(xid, None) is not None


# -- the descriptor (a room's database.py)


class ToyDatabase(SqlDatabase):
    name = "Toy SQL"
    conn_type = CONN_TYPE
    # SQLite locks the whole file for a writer: no row locks to spell; JSON is text. It names no columns of a
    # VALUES table (``AS b (columns)``): the commit point's table of partitions is a UNION ALL of SELECTs.
    dialect = StoreDialect(name="Toy SQL", insert_ignore="INSERT OR IGNORE INTO {table} ({columns}) VALUES ({values})",
                           increment_on_conflict=("ON CONFLICT ({key}) DO UPDATE SET epoch = epoch + 1, "
                                                  "taken_at = {now}"),
                           share_lock="", utc_session="SELECT 1", identifier_quote='"', exclusive_lock="",
                           random_id="lower(hex(randomblob(16)))", now="(strftime('%Y-%m-%d %H:%M:%f', 'now'))",
                           timestamp_type="TIMESTAMP", utc_datetime_type="TIMESTAMP", json_type="TEXT",
                           identity_column="INTEGER PRIMARY KEY AUTOINCREMENT", values_table=False)
    migrations = ((1, store_tables(dialect)),)  # the offset store's tables: written once, spelled by the dialect
    spark_column_types = {"string": "TEXT", "int": "INTEGER", "bigint": "INTEGER", "double": "REAL"}
    dead_letter_migrations = ((2, "kafka_headers", "TEXT"),)
    location_keys = ("path",)

    def connect(self, connect_kwargs: Mapping[str, Any], **options: Any) -> Any:
        return _Connection(connect_kwargs["path"], options.get("autocommit", False), options.get("dicts", False))

    def store_connection(self, connect_kwargs: Mapping[str, Any]) -> Any:
        return _Connection(connect_kwargs["path"], False, True, timestamps=True)

    def errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def where(self, connect_kwargs: Mapping[str, Any]) -> str:
        return str(connect_kwargs["path"])

    def is_duplicate_column(self, exc: BaseException) -> bool:
        return "duplicate column name" in str(exc)

    def is_missing_table(self, exc: BaseException) -> bool:
        return "no such table" in str(exc)

    def read_dicts(self, connect_kwargs: Mapping[str, Any], statement: str,
                   args: Sequence[Any]) -> list[dict[str, Any]]:
        conn = self.connect(connect_kwargs, autocommit=True, dicts=True)
        try:
            with conn.cursor() as cur:
                return list(cur.execute(statement, args).fetchall())
        finally:
            conn.close()

    def lock_migrations(self, cur: Any) -> None:
        cur.execute("BEGIN IMMEDIATE")

    def already_applied(self, exc: BaseException) -> bool:
        return "already exists" in str(exc) or "duplicate column name" in str(exc)

    def quote_table(self, table: str) -> str:
        return quote_table(table)

    def add_column_statement(self, table: str, column: str, sql_type: str) -> str:
        return f"ALTER TABLE {quote_table(table)} ADD COLUMN {quote_identifier(column, 'column name')} {sql_type}"

    def dead_letter_ddl(self, table: str) -> str:
        return dead_letter_table_ddl(quote_table(table), binary="BLOB", created_at="TEXT DEFAULT CURRENT_TIMESTAMP",
                                     migrations=self.dead_letter_migrations)

    def table_columns(self, cur: Any, table: str) -> list[str]:
        return [row[1] for row in cur.execute(f"PRAGMA table_info({quote_table(table)})").fetchall()]

    def fence_advice(self, store_kwargs: Mapping[str, Any]) -> str:
        return "in the store's file are fenced by it"

    def lock_wait(self, seconds: int) -> str:
        return f"PRAGMA busy_timeout = {int(seconds) * 1000}"

    @contextlib.contextmanager
    def two_phase_session(self, connect_kwargs: Mapping[str, Any]) -> Iterator[PreparedBranches]:
        yield ToyPreparedBranches(connect_kwargs["path"])


DATABASE = ToyDatabase()


# -- the offset store (a room's store.py)


def _store(connection: ConnectionInfo) -> SqlOffsetStore:
    """The offset store on the toy database: the shared store SQL over its descriptor."""
    return SqlOffsetStore(DATABASE, connect_kwargs(connection))


# -- the partition writer (a room's writer.py)


@dataclass(frozen=True, kw_only=True)
class ToyWriter(SqlPartitionWriter):
    two_phase: bool

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        found = nonempty(batches)
        if found is None:
            return None, 0
        _, stream = found
        rows = [tuple(row[c] for c in self.columns) for batch in stream for row in batch.to_pylist()]
        path = self.connect_kwargs["path"]
        if self.two_phase:
            xid = self.xid(partition, stage_id, attempt_id)
            branches = ToyPreparedBranches(path)
            rollback_earlier_attempts(branches, xid)
            branches.prepare(xid, self.table, self.columns, self.key_columns, dict(self.updates), rows)
            return xid.encode(), len(rows)
        conn = DATABASE.connect(self.connect_kwargs, autocommit=False)
        try:
            with conn.cursor() as cur:
                for row in rows:
                    cur.execute(upsert_statement(self.table, self.columns, self.key_columns, self.updates), row)
            conn.commit()
        finally:
            conn.close()
        return None, len(rows)


# -- the adapters (a room's sink.py)


class ToyTableSink(SqlTableSink):
    database = DATABASE
    writer_class = ToyWriter

    def _check_target(self, conn: Any) -> None:
        with conn.cursor() as cur:
            self.table_columns = DATABASE.table_columns(cur, self.table)
        if not self.table_columns:
            raise ConfigurationError(f"{self.name}: table {self.table!r} does not exist: create it first")
        self._check_key_columns(self.table_columns)

    def _writer_options(self) -> dict[str, Any]:
        return {"two_phase": self.two_phase}


class ToyUpsertAdapter(SqlUpsertAdapter, ToyTableSink):
    """Idempotent upsert on the toy database."""


class ToyTwoPhaseAdapter(SqlTwoPhaseAdapter, ToyTableSink):
    """Two-phase commit on the toy database."""


# -- the specs and their registration (a room's specs.py and __init__.py)


@dataclass(frozen=True)
class ToyUpsertSink(SqlTableSinkSpec):
    """The toy database's upsert sink."""

    conn_id: str = "toy_default"

    connect_kwargs_function = "tests.support.toy_database:connect_kwargs"

    def __post_init__(self) -> None:
        self._check_table_sink("ToyUpsertSink", "ToyTwoPhaseSink", quote_table, validate_identifier)

    def _asset(self, db: Mapping[str, Any]) -> SinkAsset:
        return SinkAsset(f"file://{db['path']}", self.table)


@dataclass(frozen=True)
class ToyTwoPhaseSink(ToyUpsertSink):
    """The toy database's two-phase sink."""


def register() -> None:
    """The room's registration: its driver, its offset store, and its two kinds with their capabilities and
    factories."""
    register_driver(Driver(CONN_TYPE, "Toy SQL", "sqlite3", ("Error",)))
    register_store(CONN_TYPE, _store)
    # The shared SQL kinds' capabilities, less what the toy's SQL does not do (deletes; seen ids and change positions:
    # its dialect has no table for them).
    register_sink(ToyUpsertSink, replace(upsert_capabilities(CONN_TYPE), deletes=False, seen_ids=False,
                                         applies_changes=False),
                  table_sink_factory("tests.support.toy_database:ToyUpsertAdapter", fenced=True))
    register_sink(ToyTwoPhaseSink, replace(two_phase_capabilities(CONN_TYPE), seen_ids=False),
                  table_sink_factory("tests.support.toy_database:ToyTwoPhaseAdapter", fenced=False))



