"""The SQL table sink, driver side, once for every database (``docs/architecture.md``, "Sinks"): the checks every
database shares, the partition writers handed to the engine's partition runner, dead letters, new columns, and the two
variants: idempotent upsert (:class:`SqlUpsertAdapter`) and two-phase commit over the database's
:class:`~airflow_eo.core.two_phase.PreparedBranches` (:class:`SqlTwoPhaseAdapter`).

A database's folder subclasses :class:`SqlTableSink` with its :class:`~airflow_eo.sqlsink.database.SqlDatabase` and
what only it reads of a target table (``_check_target``), and its writer (``writer_class``, ``_writer_options``); its
public adapters are the two variants over that subclass.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from airflow_eo.core.batch import DEAD_LETTER_FIELDS, BatchContext, BatchRecord, DeadLetter, WritePlan, WriteResult
from airflow_eo.core.changes import CHANGE_POSITION_FIELDS, CHANGE_POSITION_KEY
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.dedup import SEEN_ID_FIELDS, SEEN_ID_KEY, seen_pipeline_key
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.orphans import ScannedBranch
from airflow_eo.core.recovery import BranchAction, SinkRecovery
from airflow_eo.core.sink_kinds import KindAdapter
from airflow_eo.core.two_phase import attempt_branches, commit_batch_branches, refused_write_branches, resolve_branches
from airflow_eo.core.value_checks import ColumnFacts, ValueRule, value_rules
from airflow_eo.core.xid import Xid, pipeline_key
from airflow_eo.sqlsink.change_positions import (
    CHANGE_POSITION_TABLE,
    PositionLookup,
    create_change_position_table,
    purge_delete_markers,
    truncate_once,
)
from airflow_eo.sqlsink.columns import add_new_columns
from airflow_eo.sqlsink.database import SqlDatabase
from airflow_eo.sqlsink.dead_letters import (
    DEAD_LETTER_UPGRADE_WAIT_S,
    read_dead_letters,
    write_dead_letters_through_driver,
)
from airflow_eo.sqlsink.pipeline_owners import claim_pipeline_rows
from airflow_eo.sqlsink.pipeline_rows import SqlPipelineRows
from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE, SeenIdLookup, create_seen_id_table, purge_seen_ids
from airflow_eo.sqlsink.writer import SqlPartitionWriter
from airflow_eo.sqlstore.fence import EpochFence

log = logging.getLogger(__name__)

#: The dead-letter table's key: a replay rewrites the same rows.
DEAD_LETTER_KEY = ("pipeline_id", "topic", "kafka_partition", "kafka_offset")


class SqlTableSink(SqlPipelineRows, KindAdapter):
    """What every SQL sink shares: the checks of the target table, and the partition writers.

    :param connect_kwargs: the driver's arguments of the sink's database (its Airflow connection).
    :param name: the sink kind's name, for messages.
    :param table: target table (``table`` or ``schema.table``).
    :param key_columns: the upsert key (a PRIMARY KEY / UNIQUE index on exactly these).
    :param updates: per non-key column, ``"replace"`` or ``"add"``.
    :param dead_letter_table: where bad records go.
    :param add_missing_columns: add the output's new columns before the write (else refuse them).
    """

    #: the database (its folder's descriptor)
    database: ClassVar[SqlDatabase]
    #: the executor-side writer of one partition
    writer_class: ClassVar[type[SqlPartitionWriter]]

    #: one prepared branch per Spark task, committed after the commit point
    two_phase = False

    def __init__(self, connect_kwargs: Mapping[str, Any], *, name: str, table: str, key_columns: Sequence[str],
                 updates: Mapping[str, str], dead_letter_table: str, add_missing_columns: bool = False) -> None:
        self.connect_kwargs = dict(connect_kwargs)
        self.name, self.table, self.key_columns = name, table, tuple(key_columns)
        self.updates, self.dead_letter_table = dict(updates), dead_letter_table
        self.table_columns: list[str] = []
        self.column_facts: list[ColumnFacts] = []
        self.add_missing_columns = add_missing_columns

    def close(self) -> None:
        """Close the driver's connection this process keeps for the sink's database
        (:meth:`~airflow_eo.sqlsink.database.SqlDatabase.driver_connection`)."""
        self.database.close_driver_connections(self.connect_kwargs)

    # -- checks before any side effect

    def check(self) -> None:
        """The server, the table, its unique key; reads only."""
        db = self.database
        with contextlib.ExitStack() as connected:
            try:
                conn = connected.enter_context(db.driver_connection(self.connect_kwargs))
            except db.errors() as exc:
                raise ConfigurationError(f"{self.name}: cannot connect to {db.name} at {db.where(self.connect_kwargs)} "
                                         f"as {self.connect_kwargs.get('user')!r}: {db.describe(exc)}") from exc
            self._check_target(conn)
            with conn.cursor() as cur:
                self.column_facts = db.column_facts(cur, self.table)

    def value_rules(self, output: Sequence[tuple[str, str]]) -> list[ValueRule]:
        """What the table refuses of the ``output`` columns' values (name, Spark type), checked where the records
        are parsed: such a record is a bad record, not a failed write (:mod:`airflow_eo.core.value_checks`)."""
        return value_rules(self.table, self.column_facts, output, self.database.refuses_nul_in_text)

    @property
    def output_table(self) -> str:
        return self.table

    def refused_by_output(self, writer: object) -> bool:
        """A refusal is the output table's when its writer writes that table (not the dead-letter or seen-id
        table's writer)."""
        return isinstance(writer, SqlPartitionWriter) and writer.table == self.table

    def void_refused_write(self, batch: BatchContext) -> None:
        """Nothing prepared to roll back: an upsert's tasks end their transactions (a refused one rolled back)."""
        return None

    def _check_target(self, conn: Any) -> None:
        """The database's reads of its server and of the target table (sets :attr:`table_columns`)."""
        raise NotImplementedError

    def _check_key_columns(self, columns: Sequence[str]) -> None:
        """Refuse a target table (with ``columns``) that lacks a key column."""
        missing = [k for k in self.key_columns if k not in columns]
        if missing:
            raise ConfigurationError(f"{self.name}: table {self.table!r} has no key column(s) "
                                     f"{', '.join(missing)}; its columns are {', '.join(columns)}")

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
        """Every Spark task writes its partition (one prepared branch each, two-phase)."""
        output = [(f.name, f.dataType.simpleString()) for f in plan.output.schema.fields]
        self.table_columns += add_new_columns(self.database, self.name, self.connect_kwargs, self.table,
                                              self.table_columns, output, self.add_missing_columns)
        return plan.run_partitions(self.partition_writer(batch, plan.output.columns))

    def can_hold_writes(self, out: Any) -> bool:
        """Whether a partition's writer can hold its rows uncommitted while the tasks vote."""
        return False

    def epoch_fence(self, batch: BatchContext) -> EpochFence | None:
        """The fence of this attempt's visible writes; None when they need none."""
        return None

    def _writer_options(self) -> dict[str, Any]:
        """The database's own fields of :attr:`writer_class`."""
        return {}

    def _writer(self, batch: BatchContext, table: str, columns: Sequence[str], key_columns: Sequence[str],
                updates: Mapping[str, str], **options: Any) -> SqlPartitionWriter:
        return self.writer_class(
            connect_kwargs=self.connect_kwargs, table=table, columns=tuple(columns), key_columns=tuple(key_columns),
            updates=dict(updates), pipeline_key=pipeline_key(batch.pipeline_id), batch_id=batch.batch_id,
            epoch=batch.epoch, fence=self.epoch_fence(batch), **self._writer_options(), **options)

    def partition_writer(self, batch: BatchContext, columns: Sequence[str]) -> SqlPartitionWriter:
        self.check_columns(columns)
        return self._writer(batch, self.table, columns, self.key_columns, self.updates)

    # -- dead letters

    def dead_letter_writer(self, batch: BatchContext) -> SqlPartitionWriter:
        """The dead-letter table's writer (:class:`~airflow_eo.core.protocol.ExecutorDeadLetters`): keyed by pipeline,
        topic, partition and offset, so a replay rewrites the same rows; the executors' dead letters go in their own
        transaction per task, as the good rows do (fenced upsert transactions, or prepared branches committed with
        the batch's). Creates the table when missing, or adds the columns an older release's table lacks (the
        database's ``dead_letter_migrations``), on the driver before any transaction of the batch starts (DDL may
        commit on its own; never in :meth:`check`, which has no side effect)."""
        db = self.database
        conn = db.connect(self.connect_kwargs, autocommit=True)
        try:
            with conn.cursor() as cur:
                # Looked up first: DDL on an existing table would still wait for other pipelines' prepared branches.
                columns = db.table_columns(cur, self.dead_letter_table)
                if not columns:
                    cur.execute(db.dead_letter_ddl(self.dead_letter_table))
                    written: tuple[str, ...] = DEAD_LETTER_FIELDS
                else:
                    self._before_dead_letter_upgrade(cur, batch)
                    fold = str.lower if db.case_insensitive_columns else str
                    have = {fold(c) for c in self._upgrade_dead_letter_table(cur, columns)}
                    written = tuple(c for c in DEAD_LETTER_FIELDS if fold(c) in have)
                db.check_own_table(cur, self.dead_letter_table)  # another role's may carry its trigger
                options = self._dead_letter_writer_options(cur, written)
        finally:
            conn.close()
        return self._writer(batch, self.dead_letter_table, written, DEAD_LETTER_KEY, {}, **options)

    def _before_dead_letter_upgrade(self, cur: Any, batch: BatchContext) -> None:
        """The database's own conversion of an existing dead-letter table (e.g. of its collation), if any."""

    def _dead_letter_writer_options(self, cur: Any, written: Sequence[str]) -> dict[str, Any]:
        """The database's own options of the dead-letter table's writer."""
        return {}

    def _upgrade_dead_letter_table(self, cur: Any, columns: Sequence[str]) -> list[str]:
        """Once per table made by an older release: the columns it has afterwards. The ALTER waits a few seconds at
        most for other pipelines' prepared branches on the table (they end when their pipelines next run, or with
        ``airflow eo recover``); a table it cannot change yet (or without the privilege) keeps its columns and gets
        this batch's dead letters without the new ones, with a warning naming the statement: another pipeline's
        branch in doubt must not stop this one."""
        db = self.database
        statements = db.dead_letter_upgrades(self.dead_letter_table, columns)
        if statements:
            cur.execute(db.lock_wait(DEAD_LETTER_UPGRADE_WAIT_S))
        have = list(columns)
        for column, statement in statements:
            try:
                cur.execute(statement)
            except db.errors() as exc:
                if db.is_duplicate_column(exc):
                    have.append(column)  # added meanwhile by another pipeline's batch
                    continue
                log.warning("%s: dead-letter table %s lacks column %s and could not get it (%s): this batch's dead "
                            "letters are written without it. Run, as %s, once no %s holds the table: %s", self.name,
                            self.dead_letter_table, column, db.describe(exc), db.alter_role, db.branch_name, statement)
                continue
            have.append(column)
            log.info("%s: dead-letter table %s upgraded: %s", self.name, self.dead_letter_table, statement)
        return have

    # -- seen event ids (dedup_key)

    def seen_id_writer(self, batch: BatchContext) -> SqlPartitionWriter:
        """The seen-id table's writer (:class:`~airflow_eo.core.protocol.SeenIds`): upserts keyed by pipeline and
        id, each task in its own branch / fenced transaction as the good rows are, committed with the batch's.
        Creates the table when missing, on the driver before any transaction of the batch starts."""
        create_seen_id_table(self.database, self.connect_kwargs, SEEN_ID_TABLE)
        claim_pipeline_rows(self.database, self.connect_kwargs, batch.pipeline_id, batch.store_identity)
        return self._writer(batch, SEEN_ID_TABLE, SEEN_ID_FIELDS, SEEN_ID_KEY,
                            {c: "replace" for c in SEEN_ID_FIELDS if c not in SEEN_ID_KEY},
                            **self._seen_id_writer_options())

    def _seen_id_writer_options(self) -> dict[str, Any]:
        """The database's own options of the seen-id writer (the table is ours: its shape is known)."""
        return {}

    def seen_id_lookup(self, batch: BatchContext) -> SeenIdLookup:
        """Where this pipeline's event ids were seen by committed batches, read by the executors."""
        return SeenIdLookup(self.database, self.connect_kwargs, SEEN_ID_TABLE, seen_pipeline_key(batch.pipeline_id))

    def purge_seen_ids(self, pipeline_id: str, before_ms: int, limit: int) -> int:
        """Remove at most ``limit`` ids seen before ``before_ms`` (epoch ms), in a transaction of their own."""
        return purge_seen_ids(self.database, self.connect_kwargs, SEEN_ID_TABLE, seen_pipeline_key(pipeline_id),
                              before_ms, limit)

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        """Dead letters streamed through the driver (the engine's path when its executors could not write them) into
        one :meth:`dead_letter_writer` (one prepared branch, two-phase)."""
        return write_dead_letters_through_driver(batch, records, self.dead_letter_writer)

    def commit(self, batch: BatchRecord) -> None:
        return None  # the store's commit is the commit point

    def dead_letters(self, pipeline_id: str, batch_id: int | None, limit: int) -> list[dict[str, Any]] | None:
        """The pipeline's dead letters in this sink's table (``airflow eo dead-letters``, the DAG tab)."""
        return read_dead_letters(self.database, self.connect_kwargs, self.dead_letter_table, pipeline_id, batch_id,
                                 limit)


class SqlUpsertAdapter(SqlTableSink):
    """Idempotent upsert: each Spark task commits its own writes; replays rewrite the same rows.

    Writes are visible at once, so a late write of an older attempt (an executor that outlived its SIGKILLed driver)
    could overwrite a newer row of the same key. When the offset store lives where the sink does (the database's
    ``location_keys``), every write transaction first reads the pipeline's epoch with a shared lock
    (:class:`~airflow_eo.sqlstore.fence.EpochFence`): a newer attempt's take waits for the writes in flight, and the
    older attempt's later writes abort. Elsewhere there is no such fence: stop a dead attempt's Spark application
    before re-running it.

    :param store_kwargs: the driver's arguments of the offset store's connection (None: not fenced).
    """

    def __init__(self, connect_kwargs: Mapping[str, Any], *, store_kwargs: Mapping[str, Any] | None = None,
                 **options: Any) -> None:
        super().__init__(connect_kwargs, **options)
        self.store_kwargs = dict(store_kwargs) if store_kwargs else None

    def epoch_fence(self, batch: BatchContext) -> EpochFence | None:
        """The fence of this attempt's writes, checked once here on the driver (which also tells a sink user that
        may not read the store's table what to grant, before anything is written)."""
        db, store = self.database, self.store_kwargs
        where = db.location_keys
        if store is None or [store.get(k) for k in where] != [self.connect_kwargs.get(k) for k in where]:
            return None
        fence = EpochFence(batch.pipeline_id, batch.epoch, batch.interval, db.store_schema(store), dialect=db.dialect)
        with db.driver_connection(self.connect_kwargs) as conn:  # a failed connect is raised as itself
            try:
                with conn.cursor() as cur:
                    fence.check(cur, "none")
            except db.errors() as exc:
                if not db.is_privilege_error(exc):
                    raise
                raise ConfigurationError(
                    f"{self.name}: the sink's user {self.connect_kwargs.get('user')!r} cannot read the offset "
                    f"store's epoch ({db.describe(exc)}); writes of an upsert sink {db.fence_advice(store)}") from exc
        return fence

    # -- change streams (ability applies_changes: an upsert sink deletes rows, which a change stream does)

    def position_writer(self, batch: BatchContext) -> SqlPartitionWriter:
        """The change-position table's writer (:class:`~airflow_eo.core.abilities.ChangePositions`): upserts keyed by
        pipeline and key id, each task in its own branch / fenced transaction after its output's. Creates the table
        when missing, on the driver before any transaction of the batch starts."""
        create_change_position_table(self.database, self.connect_kwargs, CHANGE_POSITION_TABLE)
        claim_pipeline_rows(self.database, self.connect_kwargs, batch.pipeline_id, batch.store_identity)
        return self._writer(batch, CHANGE_POSITION_TABLE, CHANGE_POSITION_FIELDS, CHANGE_POSITION_KEY,
                            {c: "replace" for c in CHANGE_POSITION_FIELDS if c not in CHANGE_POSITION_KEY},
                            **self._seen_id_writer_options())

    def position_lookup(self, batch: BatchContext) -> PositionLookup:
        """The positions of the changes applied to this pipeline's keys by committed batches, read by the
        executors."""
        return PositionLookup(self.database, self.connect_kwargs, CHANGE_POSITION_TABLE,
                              seen_pipeline_key(batch.pipeline_id))

    def purge_delete_markers(self, pipeline_id: str, before_ms: int, limit: int) -> int:
        """Remove at most ``limit`` delete markers of changes before ``before_ms`` (epoch ms)."""
        return purge_delete_markers(self.database, self.connect_kwargs, CHANGE_POSITION_TABLE,
                                    seen_pipeline_key(pipeline_id), before_ms, limit)

    def truncate_target(self, batch: BatchContext, position: bytes) -> bool:
        """Empty the output table once for a truncate of the source at ``position`` (``on_truncate="truncate"``)."""
        return truncate_once(self.database, self.connect_kwargs, CHANGE_POSITION_TABLE, self.table,
                             seen_pipeline_key(batch.pipeline_id), position, batch.batch_id, self.epoch_fence(batch))

    # -- protocol steps (nothing to do: every write is already visible and replay-safe)

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        return SinkRecovery()

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        return None

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        return None


class SqlTwoPhaseAdapter(SqlTableSink):
    """Two-phase commit: one prepared branch per Spark task, committed only after the store's commit point."""

    two_phase = True  # prepared branches: nothing visible before finalize

    def in_doubt(self, pipeline_id: str) -> list[Xid]:
        """The pipeline's prepared (in-doubt) branches on the sink's database (read-only)."""
        with self.database.two_phase_session(self.connect_kwargs) as branches:
            return branches.recover(pipeline_id)

    # -- every pipeline's branches on this database (airflow eo verify --all, recover --orphans: core/orphans.py)

    def in_doubt_server(self) -> str:
        return f"{self.database.name} {self.database.where(self.connect_kwargs)}"

    def in_doubt_branch_name(self) -> str:
        return self.database.branch_name

    def scan_in_doubt(self) -> list[ScannedBranch]:
        with self.database.two_phase_session(self.connect_kwargs) as branches:
            return branches.scan()

    def end_branch(self, xid: Xid, action: BranchAction) -> bool:
        with self.database.two_phase_session(self.connect_kwargs) as branches:
            return branches.commit(xid) if action is BranchAction.COMMIT else branches.rollback(xid)

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        """Resolve every prepared branch of this pipeline: commit if its batch committed and lists it, else roll
        back (:func:`~airflow_eo.core.recovery.decide_branch`); returns the decisions taken."""
        with self.database.two_phase_session(self.connect_kwargs) as branches:
            decisions = resolve_branches(branches, pipeline_id, batch_lookup, self.database.branch_name)
        return SinkRecovery(branches=decisions)  # the store's commit is the commit point: nothing rolls forward

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        with self.database.two_phase_session(self.connect_kwargs) as branches:
            commit_batch_branches(branches, batch, xids)

    def void_refused_write(self, batch: BatchContext) -> None:
        with self.database.two_phase_session(self.connect_kwargs) as branches:
            for xid in refused_write_branches(branches, batch):
                branches.rollback(xid)

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        """Roll back this attempt's branches of the batch (:func:`~airflow_eo.core.two_phase.attempt_branches`)."""
        errors = self.database.errors()
        try:
            with self.database.two_phase_session(self.connect_kwargs) as branches:
                for xid in attempt_branches(branches, batch, xids):
                    with contextlib.suppress(*errors):
                        branches.rollback(xid)
        except errors:
            pass  # best effort: the next attempt's recovery rolls them back
