"""MySQL / MariaDB sinks, driver side (``docs/architecture.md``, "Sinks"): idempotent upsert, and XA two-phase commit.

:class:`MySqlUpsertAdapter` and :class:`MySqlXaAdapter` (built by the kinds registered in ``specs.py``) check the
target before any side effect, hand a :class:`~airflow_eo.mysql.writer.PartitionWriter` to the engine's partition
runner, and (XA) recover and finalize branches through the one XA API, :class:`~airflow_eo.mysql.xa.XaFacade`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pymysql

from airflow_eo.core.batch import BatchContext, BatchRecord, DeadLetter, WritePlan, WriteResult
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError, UnsupportedServerError
from airflow_eo.core.identifiers import quote_table
from airflow_eo.core.recovery import SinkRecovery
from airflow_eo.core.sinks import TableShape, why_replace_is_not_upsert
from airflow_eo.core.two_phase import attempt_branches, commit_batch_branches, resolve_branches
from airflow_eo.core.xid import Xid, pipeline_key
from airflow_eo.mysql.bulk_load import staging_types
from airflow_eo.mysql.columns import ER_DUP_FIELDNAME, add_new_columns
from airflow_eo.mysql.connection import connect
from airflow_eo.mysql.dead_letters import read_dead_letters
from airflow_eo.mysql.sql import (
    DEAD_LETTER_COLUMNS,
    dead_letter_collation_upgrade,
    dead_letter_ddl,
    dead_letter_upgrades,
    keeps_prepared_xa,
    parse_server_version,
    supports_row_alias,
)
from airflow_eo.mysql.writer import PartitionWriter
from airflow_eo.mysql.xa import ER_SPECIFIC_ACCESS_DENIED, XaFacade, xa_session
from airflow_eo.sqlstore.dead_letters import DEAD_LETTER_UPGRADE_WAIT_S, write_dead_letters_through_driver
from airflow_eo.sqlstore.fence import EpochFence

log = logging.getLogger(__name__)



#: The dead-letter table's key, and the column the server stamps with the time a dead letter was written.
DEAD_LETTER_KEY = ("pipeline_id", "topic", "kafka_partition", "kafka_offset")
DEAD_LETTER_STAMPED = "created_at"


class MySqlTableSink:
    """What both MySQL sinks share: the checks of the target table and server, and the partition writers.

    :param connect_kwargs: pymysql arguments of the sink's database (its Airflow ``mysql`` connection).
    :param name: the sink kind's name, for messages.
    :param table: target table (``table`` or ``database.table``).
    :param key_columns: the upsert key (a PRIMARY KEY / UNIQUE index on exactly these).
    :param updates: per non-key column, ``"replace"`` or ``"add"``.
    :param rows_per_statement: rows per multi-row statement.
    :param dead_letter_table: where bad records go.
    :param bulk_load: load through a staging table when the server allows ``LOAD DATA LOCAL``.
    """

    owns_commit_point = False
    #: written into one XA branch per Spark task (prepared; committed after the commit point)
    two_phase = False
    writes_visible_before_commit = True

    def __init__(self, connect_kwargs: Mapping[str, Any], *, name: str, table: str, key_columns: Sequence[str],
                 updates: Mapping[str, str], rows_per_statement: int, dead_letter_table: str, bulk_load: bool,
                 add_missing_columns: bool = False) -> None:
        self.connect_kwargs = dict(connect_kwargs)
        self.name, self.table, self.key_columns = name, table, tuple(key_columns)
        self.updates, self.rows_per_statement = dict(updates), rows_per_statement
        self.dead_letter_table, self.wants_bulk_load = dead_letter_table, bulk_load
        self.row_alias = False
        self.bulk_load = False  # asked for, and the server allows LOAD DATA LOCAL (checked in check())
        self.table_columns: list[str] = []
        self.shape = TableShape(columns=(), unique_keys=())  # read in check()
        self.add_missing_columns = add_missing_columns

    # -- checks before any side effect

    def check(self) -> None:
        """The server, the table, its unique key; reads only."""
        kwargs = self.connect_kwargs
        try:
            conn = connect(kwargs, autocommit=True, charset="utf8mb4")
        except pymysql.err.MySQLError as exc:
            raise ConfigurationError(
                f"{self.name}: cannot connect to MySQL at {kwargs.get('host')}:"
                f"{kwargs.get('port')} as {kwargs.get('user')!r}: {exc.args[-1]}"
            ) from exc
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                row = cur.fetchone()
                assert row is not None, "SELECT VERSION() returns one row"
                flavor, version = parse_server_version(row[0])
                self.row_alias = supports_row_alias(flavor, version)
                self._check_server(conn, flavor, version)
                cur.execute("SELECT @@local_infile")
                allowed = cur.fetchone()
                self.bulk_load = bool(self.wants_bulk_load and allowed and int(allowed[0]))
                if self.wants_bulk_load and not self.bulk_load:
                    log.info("%s: the server does not allow LOAD DATA LOCAL INFILE (local_infile=OFF); writing with "
                             "multi-row statements", self.name)
                self.table_columns = self._table_columns(cur)
                self.shape = self._table_shape(cur, self._check_unique_key(cur))
        finally:
            conn.close()

    def _check_server(self, conn: pymysql.connections.Connection, flavor: str, version: tuple[int, int, int]) -> None:
        """The XA sink's stricter requirements."""

    def _split_table(self) -> tuple[str | None, str]:
        return _split(self.table)

    def _table_columns(self, cur: Any) -> list[str]:
        schema, table = self._split_table()
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) "
            "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (schema, table),
        )
        columns = [row[0] for row in cur.fetchall()]
        if not columns:
            raise ConfigurationError(
                f"{self.name}: table {self.table!r} does not exist in database "
                f"{schema or self.connect_kwargs.get('database')!r}: create it first"
            )
        missing = [k for k in self.key_columns if k not in columns]
        if missing:
            raise ConfigurationError(f"{self.name}: table {self.table!r} has no key column(s) "
                                     f"{', '.join(missing)}; its columns are {', '.join(columns)}")
        return columns

    def _table_shape(self, cur: Any, unique_keys: tuple[frozenset[str], ...], name: str | None = None) -> TableShape:
        """What decides whether a replacing load of table ``name`` (the sink's by default) equals the upsert
        (:func:`why_replace_is_not_upsert`); read only. The table's triggers are visible only with the TRIGGER
        privilege: without it, they are taken to exist."""
        schema, table = _split(name or self.table)
        where = "TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s"
        cur.execute(f"SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE {where} AND EXTRA NOT LIKE "
                    "'%%GENERATED%%'", (schema, table))
        columns = tuple(row[0] for row in cur.fetchall())
        cur.execute(f"SELECT TABLE_TYPE FROM information_schema.TABLES WHERE {where}", (schema, table))
        row = cur.fetchone()
        cur.execute(
            "SELECT (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = "
            "COALESCE(%s, DATABASE()) AND EVENT_OBJECT_TABLE = %s), "
            "(SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES WHERE PRIVILEGE_TYPE = 'TRIGGER') + "
            "(SELECT COUNT(*) FROM information_schema.SCHEMA_PRIVILEGES WHERE PRIVILEGE_TYPE = 'TRIGGER' AND "
            "COALESCE(%s, DATABASE()) LIKE TABLE_SCHEMA) + "
            "(SELECT COUNT(*) FROM information_schema.TABLE_PRIVILEGES WHERE PRIVILEGE_TYPE = 'TRIGGER' AND "
            f"{where}), "
            "(SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE UNIQUE_CONSTRAINT_SCHEMA = "
            "COALESCE(%s, DATABASE()) AND REFERENCED_TABLE_NAME = %s)",
            (schema, table, schema, schema, table, schema, table))
        triggers, may_see_triggers, referencing = cur.fetchone()
        return TableShape(columns=columns, unique_keys=unique_keys, has_triggers=bool(triggers or not may_see_triggers),
                          referenced=bool(referencing), plain=bool(row and row[0] == "BASE TABLE"))

    def _unique_keys(self, cur: Any, name: str | None = None) -> tuple[frozenset[str], ...]:
        """The columns of each PRIMARY KEY / UNIQUE index of table ``name`` (the sink's by default), by index."""
        schema, table = _split(name or self.table)
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

    def check_columns(self, columns: Sequence[str]) -> None:
        unknown = [c for c in columns if c not in self.table_columns and c != DELETE_COLUMN]
        if unknown:
            raise ConfigurationError(
                f"{self.name}: the transform's output has column(s) {', '.join(unknown)} that table "
                f"{self.table!r} lacks; its columns are {', '.join(self.table_columns)}"
            )
        missing_keys = [k for k in self.key_columns if k not in columns]
        if missing_keys:
            raise ConfigurationError(f"{self.name}: the transform's output lacks key column(s) "
                                     f"{', '.join(missing_keys)}")

    # -- writes

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """Every Spark task writes its partition (one XA branch each in XA mode)."""
        output = [(f.name, f.dataType.simpleString()) for f in plan.output.schema.fields]
        self.table_columns += add_new_columns(self.name, self.connect_kwargs, self.table, self.table_columns, output,
                                              self.add_missing_columns)
        return plan.run_partitions(self.partition_writer(batch, plan.output.columns))

    def can_hold_writes(self, out: Any) -> bool:
        """Yes when the bulk load takes every output column: a partition is staged before anything is written."""
        if not self.bulk_load:
            return False
        from pyspark.sql.pandas.types import to_arrow_schema

        return staging_types(to_arrow_schema(out.schema), out.columns) is not None

    def epoch_fence(self, batch: BatchContext) -> EpochFence | None:
        """The fence of this attempt's visible writes; None when they need none."""
        return None

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

    def partition_writer(self, batch: BatchContext, columns: Sequence[str]) -> PartitionWriter:
        self.check_columns(columns)
        return PartitionWriter(
            connect_kwargs=self.connect_kwargs, table=self.table, columns=tuple(columns),
            key_columns=self.key_columns, updates=self.updates,
            row_alias=self.row_alias, rows_per_statement=self.rows_per_statement, xa=self.two_phase,
            pipeline_key=pipeline_key(batch.pipeline_id), batch_id=batch.batch_id, epoch=batch.epoch,
            fence=self.epoch_fence(batch), bulk_load=self.bulk_load,
            replace_rows=DELETE_COLUMN not in columns and self.replaces_rows(columns),
        )

    def dead_letter_writer(self, batch: BatchContext) -> PartitionWriter:
        """The dead-letter table's writer (keyed by pipeline, topic, partition and offset: a replay rewrites the same
        rows; one XA branch per writer in XA mode). Creates the table when missing, or adds the columns an older
        release's table lacks (:data:`~airflow_eo.mysql.sql.DEAD_LETTER_MIGRATIONS`), on the driver before any branch
        of the batch starts (DDL commits on its own; never in :meth:`check`, which has no side effect)."""
        schema, table = _split(self.dead_letter_table)
        conn = connect(self.connect_kwargs, autocommit=True, charset="utf8mb4")
        try:
            with conn.cursor() as cur:
                # Looked up first: DDL on an existing table would still wait for other pipelines' prepared branches.
                cur.execute("SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE "
                            "TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s", (schema, table))
                collations = dict(cur.fetchall())
                columns = list(collations)
                if not columns:
                    cur.execute(dead_letter_ddl(self.dead_letter_table))
                    written: tuple[str, ...] = DEAD_LETTER_COLUMNS
                else:
                    self._convert_dead_letter_table(cur, batch, collations)
                    have = {c.lower() for c in self._upgrade_dead_letter_table(cur, columns)}
                    written = tuple(c for c in DEAD_LETTER_COLUMNS if c.lower() in have)
                # A replacing load sets created_at to its own time, as the column's default does for a new row (a
                # replayed dead letter of the upsert sink gets the replay's time; the XA sink's never existed).
                shape = self._table_shape(cur, self._unique_keys(cur, self.dead_letter_table), self.dead_letter_table)
                replace = self.bulk_load and why_replace_is_not_upsert(
                    shape, (*written, DEAD_LETTER_STAMPED), DEAD_LETTER_KEY, {}) is None
        finally:
            conn.close()
        return PartitionWriter(
            connect_kwargs=self.connect_kwargs, table=self.dead_letter_table, columns=written,
            key_columns=DEAD_LETTER_KEY, updates={},
            row_alias=self.row_alias, rows_per_statement=self.rows_per_statement, xa=self.two_phase,
            pipeline_key=pipeline_key(batch.pipeline_id), batch_id=batch.batch_id, epoch=batch.epoch,
            fence=self.epoch_fence(batch), bulk_load=self.bulk_load,
            replace_rows=replace, stamped=(DEAD_LETTER_STAMPED,) if replace else (),
        )

    def _convert_dead_letter_table(self, cur: Any, batch: BatchContext, collations: Mapping[str, str | None]) -> None:
        """Once per table an older release made in a case-insensitive collation: converted to byte-for-byte ids and
        topics (:data:`~airflow_eo.mysql.sql.DEAD_LETTER_COLLATION`). When it cannot be yet (another pipeline's
        prepared branch holds the table, no ALTER privilege), the batch goes on only if no two keys of it can meet:
        no other pipeline id in the table equal to ours but for case, and no two of the batch's topics alike but
        for case; else it is refused with the statement to run (the dead letters would overwrite each other)."""
        statement = dead_letter_collation_upgrade(self.dead_letter_table, collations)
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

    def _upgrade_dead_letter_table(self, cur: Any, columns: Sequence[str]) -> list[str]:
        """Once per table made by an older release: the columns it has afterwards. The ALTER waits a few seconds at
        most for other pipelines' prepared branches on the table (they end when their pipelines next run, or with
        ``airflow eo recover``); a table it cannot change yet (or without the ALTER privilege) keeps its columns and
        gets this batch's dead letters without the new ones, with a warning naming the statement: another
        pipeline's branch in doubt must not stop this one."""
        statements = dead_letter_upgrades(self.dead_letter_table, columns)
        if statements:
            cur.execute("SET SESSION lock_wait_timeout = %s", (DEAD_LETTER_UPGRADE_WAIT_S,))
        have = list(columns)
        for column, statement in statements:
            try:
                cur.execute(statement)
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] == ER_DUP_FIELDNAME:
                    have.append(column)  # added meanwhile by another pipeline's batch
                    continue
                log.warning("%s: dead-letter table %s lacks column %s and could not get it (%s): this batch's dead "
                            "letters are written without it. Run, as a user with the ALTER privilege, once no "
                            "prepared XA branch holds the table: %s", self.name, self.dead_letter_table, column,
                            exc.args[-1], statement)
                continue
            have.append(column)
            log.info("%s: dead-letter table %s upgraded: %s", self.name, self.dead_letter_table, statement)
        return have

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        """Dead letters streamed through the driver (the engine's path when its executors could not write them) into
        one :meth:`dead_letter_writer` (one XA branch)."""
        return write_dead_letters_through_driver(batch, records, self.dead_letter_writer)

    def commit(self, batch: BatchRecord) -> None:
        return None  # the store's commit is the commit point

    def dead_letters(self, pipeline_id: str, batch_id: int | None, limit: int) -> list[dict[str, Any]] | None:
        """The pipeline's dead letters in this sink's table (``airflow eo dead-letters``, the DAG tab)."""
        return read_dead_letters(self.connect_kwargs, self.dead_letter_table, pipeline_id, batch_id, limit)


def _split(table: str) -> tuple[str | None, str]:
    """``database.table`` or ``table`` → (database or None, table)."""
    parts = table.split(".")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


class MySqlUpsertAdapter(MySqlTableSink):
    """Idempotent upsert: each Spark task commits its own statements; replays rewrite the same rows.

    Writes are visible at once, so a late write of an older attempt (an executor that outlived its
    SIGKILLed driver) could overwrite a newer row of the same key. When the offset store lives on
    the same server (same host and port), every write transaction first reads the pipeline's epoch
    with a shared lock (:class:`~airflow_eo.sqlstore.fence.EpochFence`): a newer attempt's
    take waits for the writes in flight, and the older attempt's later writes abort. On another
    server there is no such fence: stop a dead attempt's Spark application before re-running it.

    :param store_kwargs: pymysql arguments of the offset store's connection (None: not fenced).
    """

    def __init__(self, connect_kwargs: Mapping[str, Any], *, store_kwargs: Mapping[str, Any] | None = None,
                 **options: Any) -> None:
        super().__init__(connect_kwargs, **options)
        self.store_kwargs = dict(store_kwargs) if store_kwargs else None

    def epoch_fence(self, batch: BatchContext) -> EpochFence | None:
        """The fence of this attempt's writes, checked once here on the driver (which also tells a sink
        user that may not read the store's table what to grant, before anything is written)."""
        store = self.store_kwargs
        if store is None or (store.get("host"), store.get("port")) != (
                self.connect_kwargs.get("host"), self.connect_kwargs.get("port")):
            return None
        fence = EpochFence(batch.pipeline_id, batch.epoch, batch.interval, store.get("database"))
        conn = connect(self.connect_kwargs, autocommit=True, charset="utf8mb4")
        try:
            with conn.cursor() as cur:
                fence.check(cur, "none")
        except pymysql.err.MySQLError as exc:
            raise ConfigurationError(
                f"{self.name}: the sink's user {self.connect_kwargs.get('user')!r} cannot read the offset store's "
                f"epoch ({exc.args[-1]}); writes of an upsert sink on the store's server are fenced by it: "
                f"GRANT SELECT ON {store.get('database')}.eo_pipeline and .eo_interval to that user"
            ) from exc
        finally:
            conn.close()
        return fence

    # -- protocol steps (nothing to do: every write is already visible and replay-safe)

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        return SinkRecovery()

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        return None

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        return None


class MySqlXaAdapter(MySqlTableSink):
    """XA: one branch per Spark task, prepared, committed only after the store's commit point."""

    two_phase = True
    writes_visible_before_commit = False  # prepared branches: nothing visible before finalize

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

    def in_doubt(self, pipeline_id: str) -> list[Xid]:
        """The pipeline's prepared (in-doubt) branches on the sink's server (read-only)."""
        with xa_session(self.connect_kwargs) as xa:
            return xa.recover(pipeline_id)

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        """Resolve every prepared branch of this pipeline: commit if its batch committed and lists it, else roll
        back (:func:`~airflow_eo.core.recovery.decide_branch`); returns the decisions taken."""
        with xa_session(self.connect_kwargs) as xa:
            decisions = resolve_branches(xa, pipeline_id, batch_lookup, "prepared XA branch")
        return SinkRecovery(branches=decisions)  # the store's commit is the commit point: nothing rolls forward

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        with xa_session(self.connect_kwargs) as xa:
            commit_batch_branches(xa, batch, xids)

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        """Roll back this attempt's branches of the batch (:func:`~airflow_eo.core.two_phase.attempt_branches`)."""
        try:
            with xa_session(self.connect_kwargs) as xa:
                for xid in attempt_branches(xa, batch, xids):
                    with contextlib.suppress(pymysql.err.MySQLError):
                        xa.rollback(xid)
        except pymysql.err.MySQLError:
            pass  # best effort: the next attempt's recovery rolls them back
