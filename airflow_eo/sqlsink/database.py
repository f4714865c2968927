"""The descriptor of one SQL database: everything the shared sink and store ask of it (``docs/architecture.md``,
"The recipe for a new database").

A database's folder subclasses :class:`SqlDatabase` once (``mysql/database.py``, ``postgres/database.py``): how to
connect, the driver's errors (and which of them mean "already there" or "no such table"), the store's
:class:`~airflow_eo.sqlstore.dialect.StoreDialect` and migrations, the column types, identifier rules, and its
two-phase session. Nothing here imports a driver: a descriptor imports its own, lazily, when a method runs.
"""

from __future__ import annotations

import contextlib
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from airflow_eo.core.two_phase import PreparedBranches
from airflow_eo.core.value_checks import ColumnFacts
from airflow_eo.sqlstore.connections import close_kept_under, kept_connection, pool_key
from airflow_eo.sqlstore.dialect import StoreDialect


class SqlDatabase(ABC):
    """One SQL database, as :mod:`airflow_eo.sqlsink` and :mod:`airflow_eo.sqlstore` use it.

    Connections are DB-API ones whose ``cursor()`` is a context manager, statements take ``%s`` placeholders.
    The abstract methods are what every database spells its own way (mypy and Python refuse a descriptor lacking
    one); the tables of an ability (seen ids, change positions) are asked only of a database whose kinds declare
    it (``tests/operators/test_sink_abilities.py`` checks that they do).
    """

    #: what messages call it
    name: ClassVar[str]
    #: the Airflow connection type of its sinks and store
    conn_type: ClassVar[str]
    #: the offset store's spellings
    dialect: ClassVar[StoreDialect]
    #: the offset store's versioned migrations (append only, each statement idempotent)
    migrations: ClassVar[Sequence[tuple[int, Sequence[str]]]]
    #: what the database calls a prepared branch (messages, the log)
    branch_name: ClassVar[str] = "prepared transaction"
    #: Spark's plain types (``simpleString()``) as the column types ``add_missing_columns`` adds
    spark_column_types: ClassVar[Mapping[str, str]]
    #: how it spells a decimal column type (``{precision}``, ``{scale}``)
    decimal_type: ClassVar[str] = "DECIMAL({precision},{scale})"
    #: the columns a dead-letter table gained after its first version (append only): (version, column, type)
    dead_letter_migrations: ClassVar[Sequence[tuple[int, str, str]]] = ()
    #: whether column names compare without case (an existing column of another case is the same column)
    case_insensitive_columns: ClassVar[bool] = False
    #: who may run an ALTER TABLE, for messages (``a user with the ALTER privilege``)
    alter_role: ClassVar[str] = "the table's owner"
    #: whether its text types refuse a NUL character (PostgreSQL's do)
    refuses_nul_in_text: ClassVar[bool] = False
    #: the keys of connect_kwargs that say where the database is (an upsert sink there is fenced by the store)
    location_keys: ClassVar[tuple[str, ...]] = ("host", "port")
    #: how it spells a column of ``{n}`` bytes (the keys of the tables kept beside a sink's output)
    key_binary: ClassVar[str] = "BINARY({n})"

    # -- connections and errors

    @abstractmethod
    def connect(self, connect_kwargs: Mapping[str, Any], **options: Any) -> Any:
        """A connection (``autocommit`` among ``options``) whose cursors return tuples."""
        raise NotImplementedError

    @abstractmethod
    def store_connection(self, connect_kwargs: Mapping[str, Any]) -> Any:
        """The offset store's connection: one transaction (not autocommit), cursors returning rows as dicts, and
        counting matched rows (a compare-and-set that rewrites an unchanged value still counts)."""
        raise NotImplementedError

    #: whether a process keeps its connections open between the store's transactions and the sink's driver-side
    #: steps (``sqlstore/connections.py``): only for a database whose :meth:`connection_alive` can tell a live
    #: connection from a dead one
    keeps_connections: ClassVar[bool] = False

    def connection_alive(self, conn: Any) -> bool:
        """Whether an idle connection (from :meth:`store_connection` or :meth:`driver_connection`, no transaction
        open) still answers: one round trip that starts no transaction. False for any error (the process then
        connects anew)."""
        return False

    def connection_closed(self, conn: Any) -> bool:
        """Whether the driver saw ``conn`` close (a lost connection whose error a caller caught): no round trip."""
        return False

    @contextlib.contextmanager
    def driver_connection(self, connect_kwargs: Mapping[str, Any]) -> Iterator[Any]:
        """An autocommit connection (as :meth:`connect`'s) for the sink's short steps on the driver: its checks, its
        recovery, the commit of its prepared branches, the fence check, the creation and claim of its pipeline
        tables. Kept open between them, and between batches, when the database :attr:`keeps_connections`; else new,
        and closed after the block. The block must leave it as it found it: no transaction open, no session setting
        changed."""
        if not self.keeps_connections:
            conn = self.connect(connect_kwargs, autocommit=True)
            try:
                yield conn
            finally:
                with contextlib.suppress(*self.errors()):  # a failing close must not hide the block's error
                    conn.close()
            return
        with kept_connection(pool_key(self, connect_kwargs, "driver"),
                             lambda: self.connect(connect_kwargs, autocommit=True), self.connection_alive,
                             self.connection_closed, self.errors()) as conn:
            yield conn

    def close_driver_connections(self, connect_kwargs: Mapping[str, Any]) -> None:
        """Close the idle :meth:`driver_connection` this process keeps (the next step connects anew)."""
        close_kept_under(pool_key(self, connect_kwargs, "driver"))

    @abstractmethod
    def errors(self) -> tuple[type[BaseException], ...]:
        """The driver's error base classes."""
        raise NotImplementedError

    def describe(self, exc: BaseException) -> str:
        """One of the driver's errors as its message."""
        return str(exc).strip()

    def where(self, connect_kwargs: Mapping[str, Any]) -> str:
        """``host:port`` (and database) of a connection, for messages."""
        return f"{connect_kwargs.get('host')}:{connect_kwargs.get('port')}"

    def is_duplicate_column(self, exc: BaseException) -> bool:
        """Whether ``exc`` says an added column exists already (added meanwhile by another attempt)."""
        return False

    @abstractmethod
    def is_missing_table(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the table read does not exist."""
        raise NotImplementedError

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is worth a retry (a lost connection, a deadlock), not a mistake to report."""
        return False

    @abstractmethod
    def read_dicts(self, connect_kwargs: Mapping[str, Any], statement: str,
                   args: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows of one query as dicts, timestamps in UTC, bytes as ``bytes``."""
        raise NotImplementedError

    # -- the offset store's migrations

    @abstractmethod
    def lock_migrations(self, cur: Any) -> None:
        """Serialize two stores migrating at once (held until :meth:`unlock_migrations` or the transaction's end)."""
        raise NotImplementedError

    def unlock_migrations(self, cur: Any) -> None:
        """Release what :meth:`lock_migrations` took, when the transaction's end does not."""
        return None  # by default the transaction's end does

    def already_applied(self, exc: BaseException) -> bool:
        """Whether a migration's statement failed because an interrupted run applied it (DDL that commits on its
        own); never for a database whose DDL is transactional."""
        return False

    # -- identifiers, types, statements

    @abstractmethod
    def quote_table(self, table: str) -> str:
        """``table`` or ``schema.table`` validated and quoted."""
        raise NotImplementedError

    @abstractmethod
    def add_column_statement(self, table: str, column: str, sql_type: str) -> str:
        """``ALTER TABLE .. ADD COLUMN`` of a nullable column."""
        raise NotImplementedError

    def column_type(self, spark_type: str) -> str | None:
        """The type of a new column for a Spark type name; None when there is no plain one."""
        match = re.fullmatch(r"decimal\((\d+),(\d+)\)", spark_type)
        if match:
            return self.decimal_type.format(precision=match[1], scale=match[2])
        return self.spark_column_types.get(spark_type)

    def one_of(self, column: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        """``column`` equal to one of ``values``: the condition and its parameters (``IN (%s, ..)``: one per value)."""
        return f"{column} IN ({', '.join(['%s'] * len(values))})", tuple(values)

    @abstractmethod
    def dead_letter_ddl(self, table: str) -> str:
        """``CREATE TABLE IF NOT EXISTS`` of the dead-letter table at its newest version."""
        raise NotImplementedError

    def seen_id_ddl(self, table: str) -> str:
        """``CREATE TABLE IF NOT EXISTS`` of the seen-id table (:mod:`airflow_eo.sqlsink.seen_ids`); a database whose
        kinds declare ``seen_ids`` spells it, with :meth:`purge_seen_ids`."""
        raise NotImplementedError

    def seen_id_indexes(self, table: str) -> list[str]:
        """Statements that add the seen-id table's purge index, when its DDL cannot hold it (idempotent)."""
        return []

    def purge_seen_ids(self, cur: Any, table: str, key: bytes, before_ms: int, limit: int) -> int:
        """Delete at most ``limit`` rows of pipeline ``key`` seen before ``before_ms``, never waiting on a row it does
        not delete; how many went."""
        raise NotImplementedError

    def change_position_ddl(self, table: str) -> str:
        """``CREATE TABLE IF NOT EXISTS`` of the change-position table (:mod:`airflow_eo.sqlsink.change_positions`);
        a database whose kinds declare ``applies_changes`` spells it."""
        raise NotImplementedError

    def change_position_indexes(self, table: str) -> list[str]:
        """Statements that add the change-position table's purge index, when its DDL cannot hold it (idempotent)."""
        return []

    def dead_letter_upgrades(self, table: str, columns: Iterable[str]) -> list[tuple[str, str]]:
        """``(column, ALTER TABLE statement)`` of each column an existing dead-letter table with ``columns`` lacks."""
        return missing_column_statements(table, columns, self.dead_letter_migrations, self.add_column_statement,
                                         self.case_insensitive_columns)

    @abstractmethod
    def table_columns(self, cur: Any, table: str) -> list[str]:
        """The columns of ``table`` in order; empty when it does not exist."""
        raise NotImplementedError

    def check_own_table(self, cur: Any, table: str) -> None:
        """Refuse a pipeline table (seen ids, dead letters, change positions) that another role made: it may carry
        a trigger that runs with the pipeline's rights. Nothing to check by default (MySQL's triggers run as their
        definer)."""
        return None

    def column_facts(self, cur: Any, table: str) -> list[ColumnFacts]:
        """What the catalog says of each column of ``table`` (lengths, integer ranges, NOT NULL), for the values
        checked before the write (:mod:`airflow_eo.core.value_checks`); none: no value is checked."""
        return []

    def store_schema(self, store_kwargs: Mapping[str, Any]) -> str | None:
        """What qualifies the store's tables read from a sink's connection to the same database (None: the
        connection's default)."""
        return None

    def is_privilege_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the user may not read what it asked for."""
        return True

    @abstractmethod
    def fence_advice(self, store_kwargs: Mapping[str, Any]) -> str:
        """The end of the message to a sink user who may not read the store's epoch: where the fence applies, and
        what to grant."""
        raise NotImplementedError

    @abstractmethod
    def lock_wait(self, seconds: int) -> str:
        """The session statement that bounds how long DDL waits for other sessions' locks."""
        raise NotImplementedError

    def row_lock_wait(self, seconds: int) -> str:
        """The session statement that bounds how long a statement waits for another transaction's row locks."""
        return self.lock_wait(seconds)

    # -- two-phase commit

    @abstractmethod
    @contextlib.contextmanager
    def two_phase_session(self, connect_kwargs: Mapping[str, Any]) -> Iterator[PreparedBranches]:
        """The database's two-phase API on the driver's connection (:meth:`driver_connection`; a prepared branch
        survives its session)."""
        raise NotImplementedError
        yield  # pragma: no cover


def missing_column_statements(table: str, columns: Iterable[str], migrations: Iterable[tuple[int, str, str]],
                              add_column_statement: Callable[[str, str, str], str],
                              case_insensitive: bool) -> list[tuple[str, str]]:
    """``(column, ALTER TABLE statement)`` of each column of ``migrations`` ((version, column, type), append only)
    that a table with ``columns`` lacks."""
    fold = str.lower if case_insensitive else str
    have = {fold(c) for c in columns}
    return [(column, add_column_statement(table, column, sql_type)) for _, column, sql_type in migrations
            if fold(column) not in have]


def dead_letter_table_ddl(quoted_table: str, *, binary: str, created_at: str,
                          migrations: Iterable[tuple[int, str, str]], table_options: str = "") -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a dead-letter table at its newest version (every column of ``migrations``),
    in a database's spelling of its binary columns, of ``created_at`` (type and default) and of the table's
    options."""
    return (
        f"CREATE TABLE IF NOT EXISTS {quoted_table} ("
        "pipeline_id VARCHAR(190) NOT NULL, topic VARCHAR(249) NOT NULL, kafka_partition INT NOT NULL, "
        f"kafka_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, record_key {binary} NULL, "
        f"raw_value {binary} NULL, error TEXT NOT NULL, "
        + "".join(f"{column} {sql_type} NULL, " for _, column, sql_type in migrations) +
        f"created_at {created_at}, "
        f"PRIMARY KEY (pipeline_id, topic, kafka_partition, kafka_offset)){table_options}"
    )
