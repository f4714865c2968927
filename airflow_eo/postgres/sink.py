"""PostgreSQL sinks, driver side (``docs/architecture.md``, "Sinks"): idempotent upsert, and two-phase commit with
``PREPARE TRANSACTION``.

:class:`PostgresUpsertAdapter` and :class:`PostgresTwoPhaseAdapter` (built by the kinds registered in ``specs.py``)
check the target before any side effect, hand a :class:`~airflow_eo.postgres.writer.PartitionWriter` to the engine's
partition runner, and (two-phase) recover and finalize prepared transactions through the one two-phase API,
:class:`~airflow_eo.postgres.prepared.PreparedTransactions`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg

from airflow_eo.core.batch import DEAD_LETTER_FIELDS, BatchContext, BatchRecord, DeadLetter, WritePlan, WriteResult
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError, UnsupportedServerError
from airflow_eo.core.recovery import SinkRecovery
from airflow_eo.core.two_phase import attempt_branches, commit_batch_branches, resolve_branches
from airflow_eo.core.xid import Xid, pipeline_key
from airflow_eo.postgres.columns import add_new_columns
from airflow_eo.postgres.connection import connect
from airflow_eo.postgres.dead_letters import read_dead_letters
from airflow_eo.postgres.prepared import max_prepared_transactions, prepared_session
from airflow_eo.postgres.sql import (
    dead_letter_ddl,
    dead_letter_upgrades,
    quote_identifier,
    quote_table,
    split_table,
)
from airflow_eo.postgres.writer import PartitionWriter
from airflow_eo.sqlstore.dead_letters import DEAD_LETTER_UPGRADE_WAIT_S, write_dead_letters_through_driver
from airflow_eo.sqlstore.dialect import POSTGRES
from airflow_eo.sqlstore.fence import EpochFence

log = logging.getLogger(__name__)

DEAD_LETTER_KEY = ("pipeline_id", "topic", "kafka_partition", "kafka_offset")


class PostgresTableSink:
    """What both PostgreSQL sinks share: the checks of the target table and server, and the partition writers.

    :param connect_kwargs: psycopg arguments of the sink's database (its Airflow ``postgres`` connection).
    :param name: the sink kind's name, for messages.
    :param table: target table (``table`` or ``schema.table``).
    :param key_columns: the upsert key (a PRIMARY KEY / UNIQUE constraint or index on exactly these).
    :param updates: per non-key column, ``"replace"`` or ``"add"``.
    :param dead_letter_table: where bad records go.
    """

    owns_commit_point = False
    #: one prepared transaction per Spark task, committed after the commit point
    two_phase = False
    writes_visible_before_commit = True

    def __init__(self, connect_kwargs: Mapping[str, Any], *, name: str, table: str, key_columns: Sequence[str],
                 updates: Mapping[str, str], dead_letter_table: str, add_missing_columns: bool = False) -> None:
        self.connect_kwargs = dict(connect_kwargs)
        self.name, self.table, self.key_columns = name, table, tuple(key_columns)
        self.updates, self.dead_letter_table = dict(updates), dead_letter_table
        self.table_columns: list[str] = []
        self.add_missing_columns = add_missing_columns

    def _where(self) -> str:
        kw = self.connect_kwargs
        return f"{kw.get('host')}:{kw.get('port')}/{kw.get('dbname')}"

    # -- checks before any side effect

    def check(self) -> None:
        """The server, the table, its unique key, the privileges; reads only."""
        try:
            conn = connect(self.connect_kwargs, autocommit=True)
        except psycopg.Error as exc:
            raise ConfigurationError(f"{self.name}: cannot connect to PostgreSQL at {self._where()} as "
                                     f"{self.connect_kwargs.get('user')!r}: {str(exc).strip()}") from exc
        try:
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
            missing = [k for k in self.key_columns if k not in self.table_columns]
            if missing:
                raise ConfigurationError(f"{self.name}: table {self.table!r} has no key column(s) "
                                         f"{', '.join(missing)}; its columns are {', '.join(self.table_columns)}")
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
        finally:
            conn.close()

    def _check_server(self, conn: psycopg.Connection[Any]) -> None:
        """The two-phase sink's requirements of the server."""

    def _check_table(self, conn: psycopg.Connection[Any], user: str) -> None:
        """The two-phase sink's requirements of the table's schema."""

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
        """Every Spark task writes its partition (one prepared transaction each, two-phase)."""
        output = [(f.name, f.dataType.simpleString()) for f in plan.output.schema.fields]
        self.table_columns += add_new_columns(self.name, self.connect_kwargs, self.table, self.table_columns, output,
                                              self.add_missing_columns)
        return plan.run_partitions(self.partition_writer(batch, plan.output.columns))

    def can_hold_writes(self, out: Any) -> bool:
        """Yes: every partition is staged (COPY into the session's table) before anything is written."""
        return not self.two_phase

    def epoch_fence(self, batch: BatchContext) -> EpochFence | None:
        """The fence of this attempt's visible writes; None when they need none."""
        return None

    def _writer(self, batch: BatchContext, table: str, columns: Sequence[str], key_columns: Sequence[str],
                updates: Mapping[str, str]) -> PartitionWriter:
        return PartitionWriter(
            connect_kwargs=self.connect_kwargs, table=table, columns=tuple(columns), key_columns=tuple(key_columns),
            updates=dict(updates), two_phase=self.two_phase, pipeline_key=pipeline_key(batch.pipeline_id),
            batch_id=batch.batch_id, epoch=batch.epoch, fence=self.epoch_fence(batch),
        )

    def partition_writer(self, batch: BatchContext, columns: Sequence[str]) -> PartitionWriter:
        self.check_columns(columns)
        return self._writer(batch, self.table, columns, self.key_columns, self.updates)

    def dead_letter_writer(self, batch: BatchContext) -> PartitionWriter:
        """The dead-letter table's writer (:class:`~airflow_eo.core.protocol.ExecutorDeadLetters`): keyed by pipeline,
        topic, partition and offset, so a replay rewrites the same rows; the executors' dead letters go in their own
        transaction per task, as the good rows do (fenced upsert transactions, or prepared transactions committed
        with the batch's). Creates the table when missing, or adds the columns an older release's table lacks
        (:data:`~airflow_eo.postgres.sql.DEAD_LETTER_MIGRATIONS`), on the driver before any transaction of the batch
        starts (never in :meth:`check`, which has no side effect)."""
        conn = connect(self.connect_kwargs, autocommit=True)
        try:
            conn.execute(dead_letter_ddl(self.dead_letter_table))  # IF NOT EXISTS: takes no lock on an existing table
            # Looked up first: ALTER TABLE locks the table even when the column is there.
            columns = [r[0] for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                "AND NOT attisdropped", (quote_table(self.dead_letter_table),)).fetchall()]
            have = self._upgrade_dead_letter_table(conn, columns)
        finally:
            conn.close()
        written = tuple(c for c in DEAD_LETTER_FIELDS if c in have)
        return self._writer(batch, self.dead_letter_table, written, DEAD_LETTER_KEY, {})

    def _upgrade_dead_letter_table(self, conn: psycopg.Connection[Any], columns: Sequence[str]) -> list[str]:
        """Once per table made by an older release: the columns it has afterwards. The ALTER waits a few seconds at
        most for other pipelines' prepared transactions on the table (they end when their pipelines next run, or
        with ``airflow eo recover``); a table it cannot change yet (or not as its owner) keeps its columns and gets
        this batch's dead letters without the new ones, with a warning naming the statement: another pipeline's
        transaction in doubt must not stop this one."""
        statements = dead_letter_upgrades(self.dead_letter_table, columns)
        if statements:
            conn.execute(f"SET lock_timeout = '{DEAD_LETTER_UPGRADE_WAIT_S}s'")
        have = list(columns)
        for column, statement in statements:
            try:
                conn.execute(statement)  # ADD COLUMN IF NOT EXISTS: one added meanwhile by another pipeline is fine
            except psycopg.Error as exc:
                log.warning("%s: dead-letter table %s lacks column %s and could not get it (%s): this batch's dead "
                            "letters are written without it. Run, as the table's owner, once no prepared transaction "
                            "holds the table: %s", self.name, self.dead_letter_table, column, str(exc).strip(),
                            statement)
                continue
            have.append(column)
            log.info("%s: dead-letter table %s upgraded: %s", self.name, self.dead_letter_table, statement)
        return have

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        """Dead letters streamed through the driver (the engine's path when its executors could not write them) into
        one :meth:`dead_letter_writer` (one prepared transaction, two-phase)."""
        return write_dead_letters_through_driver(batch, records, self.dead_letter_writer)

    def commit(self, batch: BatchRecord) -> None:
        return None  # the store's commit is the commit point

    def dead_letters(self, pipeline_id: str, batch_id: int | None, limit: int) -> list[dict[str, Any]] | None:
        """The pipeline's dead letters in this sink's table (``airflow eo dead-letters``, the DAG tab)."""
        return read_dead_letters(self.connect_kwargs, self.dead_letter_table, pipeline_id, batch_id, limit)


class PostgresUpsertAdapter(PostgresTableSink):
    """Idempotent upsert: each Spark task commits its own insert; replays rewrite the same rows.

    Writes are visible at once, so a late write of an older attempt (an executor that outlived its SIGKILLed driver)
    could overwrite a newer row of the same key. When the offset store lives in the same PostgreSQL database (same
    host, port and database), the insert's transaction first reads the pipeline's epoch ``FOR SHARE``
    (:class:`~airflow_eo.sqlstore.fence.EpochFence`): a newer attempt's take waits for the writes in flight, and the
    older attempt's later writes abort. Elsewhere there is no such fence: stop a dead attempt's Spark application
    before re-running it.

    :param store_kwargs: psycopg arguments of the offset store's ``postgres`` connection (None: not fenced).
    """

    def __init__(self, connect_kwargs: Mapping[str, Any], *, store_kwargs: Mapping[str, Any] | None = None,
                 **options: Any) -> None:
        super().__init__(connect_kwargs, **options)
        self.store_kwargs = dict(store_kwargs) if store_kwargs else None

    def epoch_fence(self, batch: BatchContext) -> EpochFence | None:
        """The fence of this attempt's writes, checked once here on the driver (which also tells a sink user that
        may not read the store's table what to grant, before anything is written)."""
        store = self.store_kwargs
        where = ("host", "port", "dbname")
        if store is None or [store.get(k) for k in where] != [self.connect_kwargs.get(k) for k in where]:
            return None
        fence = EpochFence(batch.pipeline_id, batch.epoch, batch.interval, None, POSTGRES)
        conn = connect(self.connect_kwargs, autocommit=True)
        try:
            fence.check(conn.cursor(), "none")
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigurationError(
                f"{self.name}: the sink's user {self.connect_kwargs.get('user')!r} cannot read the offset store's "
                f"epoch ({str(exc).strip()}); writes of an upsert sink in the store's database are fenced by it: "
                "GRANT SELECT ON eo_pipeline, eo_interval TO that user"
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


class PostgresTwoPhaseAdapter(PostgresTableSink):
    """Two-phase commit: one prepared transaction per Spark task, committed only after the store's commit point."""

    two_phase = True
    writes_visible_before_commit = False  # prepared transactions: nothing visible before finalize

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

    def in_doubt(self, pipeline_id: str) -> list[Xid]:
        """The pipeline's prepared (in-doubt) transactions in the sink's database (read-only)."""
        with prepared_session(self.connect_kwargs) as prepared:
            return prepared.recover(pipeline_id)

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        """Resolve every prepared transaction of this pipeline: commit if its batch committed and lists it, else roll
        back (:func:`~airflow_eo.core.recovery.decide_branch`); returns the decisions taken."""
        with prepared_session(self.connect_kwargs) as prepared:
            return SinkRecovery(branches=resolve_branches(prepared, pipeline_id, batch_lookup,
                                                          "prepared transaction"))

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        with prepared_session(self.connect_kwargs) as prepared:
            commit_batch_branches(prepared, batch, xids)

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        """Roll back this attempt's prepared transactions of the batch
        (:func:`~airflow_eo.core.two_phase.attempt_branches`)."""
        try:
            with prepared_session(self.connect_kwargs) as prepared:
                for xid in attempt_branches(prepared, batch, xids):
                    with contextlib.suppress(psycopg.Error):
                        prepared.rollback(xid)
        except psycopg.Error:
            pass  # best effort: the next attempt's recovery rolls them back


def two_phase_disabled_message(name: str, where: str) -> str:
    return (f"{name}: the PostgreSQL server at {where} has max_prepared_transactions = 0, so PREPARE TRANSACTION "
            "fails; set max_prepared_transactions (postgresql.conf) to at least the pipeline's Spark write tasks + 1 "
            "(e.g. 100) and restart the server, or use PostgresUpsertSink")
