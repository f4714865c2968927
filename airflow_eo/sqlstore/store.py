"""The durable offset store on a SQL database (``docs/architecture.md``, "The offset store").

Three tables: ``eo_pipeline`` (fencing epoch), ``eo_batch`` (the batch log: Spark's
offset log and commit log in one) and ``eo_offset`` (committed position per
partition). Every write after :meth:`take_pipeline` checks the caller's epoch under
a lock on the pipeline row, and the commit point is one local transaction of
compare-and-sets (:meth:`commit_batch`). ``eo_interval`` fences interval-mode
batches; ``eo_audit`` records what people did to a pipeline (``airflow eo rewind``,
``recover``). One SQL text for every database (``%s`` placeholders, rows as dicts); what differs is the
:class:`~airflow_eo.sqlstore.dialect.StoreDialect`. Each database's room supplies its connections, migrations and
dialect in one descriptor (:class:`OffsetStoreDatabase`, the store's part of
:class:`~airflow_eo.sqlsink.database.SqlDatabase`); the fence: ``fence.py``; the operations' reads
and the audited rewind: ``reads.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from airflow_eo.core.batch import BatchRecord, BatchSummary, Owner
from airflow_eo.core.batch_states import UNFINISHED, BatchState, can_transition
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.errors import (
    CommitConflictError,
    OperationError,
    PipelineConflictError,
    RetiredPipelineError,
)
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.lifecycle import retired_message
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange, TopicPartition, ranges_to_json, repeated_partition
from airflow_eo.sqlstore.commit_point import advance_offsets
from airflow_eo.sqlstore.connections import StoreConnections
from airflow_eo.sqlstore.dialect import StoreDialect
from airflow_eo.sqlstore.fence import EpochFence, utc_bounds
from airflow_eo.sqlstore.history import StoreHistory
from airflow_eo.sqlstore.lifecycle import StoreLifecycle
from airflow_eo.sqlstore.operations import StoreOperations
from airflow_eo.sqlstore.rows import batch_record, row_owner


def _described(owner: Owner) -> str:
    return f"DAG {owner.dag_id!r} task {owner.task_id!r}"


class _NoSchemaVersion(Exception):
    """The store has no schema version table."""


class OffsetStoreDatabase(Protocol):
    """What the store asks of its database's descriptor (:class:`~airflow_eo.sqlsink.database.SqlDatabase`)."""

    @property
    def dialect(self) -> StoreDialect: ...

    @property
    def migrations(self) -> Sequence[tuple[int, Sequence[str]]]: ...

    def store_connection(self, connect_kwargs: Mapping[str, Any]) -> Any:
        """One transaction's connection: cursors return rows as dicts and count matched rows."""

    @property
    def keeps_connections(self) -> bool:
        """Whether the store keeps its connections open between transactions (it can tell a live one)."""

    def connection_alive(self, conn: Any) -> bool:
        """Whether an idle store connection still answers (asked before it is used again)."""

    def connection_closed(self, conn: Any) -> bool:
        """Whether the driver saw the connection close (no round trip)."""

    def errors(self) -> tuple[type[BaseException], ...]: ...

    def is_missing_table(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a statement's table does not exist."""

    def lock_migrations(self, cur: Any) -> None: ...

    def unlock_migrations(self, cur: Any) -> None: ...

    def already_applied(self, exc: BaseException) -> bool: ...


class SqlOffsetStore(StoreLifecycle, StoreOperations, StoreHistory):
    """The protocol's :class:`~airflow_eo.core.protocol.OffsetStore` and the operations'
    :class:`~airflow_eo.core.stores.ManagedOffsetStore` on a SQL database: the same class for every database,
    built over the room's descriptor (a room's ``register_store`` factory).

    :param database: the room's descriptor: connections, migrations, dialect.
    :param connect_kwargs: the driver's arguments (from the store's Airflow connection).
    """

    _migrated = False
    _identity: str | None = None
    #: Reads only (the UI's GET endpoints): never migrate (DDL, a lock); a schema behind is refused instead.
    read_only = False

    def __init__(self, database: OffsetStoreDatabase, connect_kwargs: Mapping[str, Any]) -> None:
        self.database = database
        self._connections = StoreConnections(database, connect_kwargs)

    @property
    def dialect(self) -> StoreDialect:  # type: ignore[override]
        return self.database.dialect

    def transaction(self) -> AbstractContextManager[Any]:
        """One transaction on one connection (kept open for the next: ``sqlstore/connections.py``): committed on
        success, rolled back on error."""
        return self._connections.transaction()

    def close(self) -> None:
        """Close the idle connections kept for this store's database in this process."""
        self._connections.close()

    def migrate(self) -> None:
        if self._migrated:
            return
        if self.read_only:
            self._check_schema()
        elif not self._schema_current():
            with self.transaction() as cur:
                self._migrate(cur)
        self._migrated = True

    def _schema_current(self) -> bool:
        """Whether every migration of this release is applied, read without the migration lock: the common case
        (each task's store is new) then costs one read instead of serializing every starting task on the lock."""
        try:
            return self._applied_versions() >= {version for version, _ in self.database.migrations}
        except _NoSchemaVersion:
            return False

    def _migrate(self, cur: Any) -> None:
        """Apply the database's migrations not applied yet, in ``cur``'s transaction, serialized by the database's
        migration lock (two DAGs starting at once). A statement the database says an interrupted run applied
        already (DDL that commits on its own) counts as done."""
        db = self.database
        db.lock_migrations(cur)
        try:
            cur.execute("CREATE TABLE IF NOT EXISTS eo_schema_version (version INT NOT NULL PRIMARY KEY)")
            cur.execute("SELECT version FROM eo_schema_version")
            applied = {row["version"] for row in cur.fetchall()}
            for version, statements in db.migrations:
                if version in applied:
                    continue
                for statement in statements:
                    try:
                        cur.execute(statement)
                    except db.errors() as exc:
                        if not db.already_applied(exc):
                            raise
                # Ignoring a row already there: on MySQL the lock is released before this transaction commits, so
                # a migrator that waited for it may not see the version and apply it again (idempotent statements).
                cur.execute(self.dialect.insert_ignoring("eo_schema_version", ("version",), ("version",)), (version,))
        finally:
            db.unlock_migrations(cur)

    def _latest_schema_version(self) -> int:
        """The version the room's migrations reach."""
        return max(version for version, _ in self.database.migrations)

    def _check_schema(self) -> None:
        """Refuse to read a store whose schema is behind this release (reads must not write)."""
        latest = self._latest_schema_version()
        cause: BaseException | None = None
        try:
            version = max(self._applied_versions(), default=0)
        except _NoSchemaVersion as missing:
            version, cause = 0, missing.__cause__
        if version < latest:
            raise OperationError(f"the offset store's schema is at version {version}, this airflow_eo needs {latest}: "
                                 "a pipeline's next run or any `airflow eo` command migrates it; this view only "
                                 "reads") from cause

    def _applied_versions(self) -> set[int]:
        """The schema versions applied to the store; :class:`_NoSchemaVersion` when nothing ran against it yet."""
        with self.transaction() as cur:  # an unreachable store fails here, as itself
            try:
                cur.execute("SELECT version FROM eo_schema_version")
            except self.database.errors() as exc:
                if not self.database.is_missing_table(exc):
                    raise  # a lost connection, say: as itself
                raise _NoSchemaVersion() from exc  # no version table (out of the transaction: rolled back)
            return {int(row["version"]) for row in cur.fetchall()}

    def _fence(self, cur: Any, pipeline_id: str, interval: Interval | None, epoch: int) -> None:
        """Lock the row holding the fencing epoch (the pipeline's, or in interval mode the interval's)
        and check it still carries ours."""
        EpochFence(pipeline_id, epoch, interval, dialect=self.dialect).check(cur)

    def _claim(self, cur: Any, pipeline_id: str, owner: Owner | None, mode: str, sink: SinkRecord | None) -> int:
        """Lock (creating it if new) the pipeline row; refuse a second owner or another mode; record the sink.
        Returns the row's epoch as locked.

        Owners are compared by DAG id and task id apart; a row recorded before the store kept them apart (only
        ``owner``, ``<dag_id>.<task_id>``) is compared by that text, and then adopts the ids of the matching owner.
        """
        # Create the row only when a plain (unlocking) read does not see it: on MySQL an INSERT IGNORE of an existing
        # row takes a shared lock, and two takes that each hold one and then ask for the exclusive lock deadlock.
        cur.execute("SELECT 1 FROM eo_pipeline WHERE pipeline_id = %s", (pipeline_id,))
        if cur.fetchone() is None:
            cur.execute(self.dialect.insert_ignoring("eo_pipeline", ("pipeline_id", "epoch"), ("pipeline_id",),
                                                     ("%s", "0")), (pipeline_id,))
        cur.execute("SELECT epoch, owner, owner_dag_id, owner_task_id, mode, retired_at FROM eo_pipeline "
                    f"WHERE pipeline_id = %s {self.dialect.exclusive_lock}", (pipeline_id,))
        row = cur.fetchone()
        if row["retired_at"] is not None:  # the tombstone of `airflow eo retire`: its id runs again only after --undo
            raise RetiredPipelineError(retired_message(pipeline_id, row["retired_at"]))
        recorded = row_owner(row)
        if owner and (recorded != owner if recorded else row["owner"] and row["owner"] != str(owner)):
            theirs = _described(recorded) if recorded else row["owner"]
            raise PipelineConflictError(
                f"pipeline id {pipeline_id!r} belongs to {theirs}, and {_described(owner)} declares the same "
                "pipeline id: two tasks sharing one pipeline would split its offsets between them. Give one "
                "of them its own pipeline_id=. To move the pipeline to the new task on purpose, clear its "
                "owner in the offset store: UPDATE eo_pipeline SET owner = NULL, owner_dag_id = NULL, "
                f"owner_task_id = NULL WHERE pipeline_id = '{pipeline_id}'"
            )
        if row["mode"] and row["mode"] != mode:
            raise PipelineConflictError(
                f"pipeline id {pipeline_id!r} ran in {row['mode']} mode ({row['owner'] or 'owner unknown'}); "
                f"{owner or 'this task'} runs it in {mode} mode. A pipeline keeps one mode: give the "
                f"{mode}-mode task its own pipeline_id="
            )
        if (owner and not recorded) or not row["mode"]:
            dag_id, task_id = (owner.dag_id, owner.task_id) if owner else (None, None)
            cur.execute("UPDATE eo_pipeline SET owner = COALESCE(owner, %s), owner_dag_id = COALESCE(owner_dag_id, "
                        "%s), owner_task_id = COALESCE(owner_task_id, %s), mode = COALESCE(mode, %s) "
                        "WHERE pipeline_id = %s",
                        (None if owner is None else str(owner), dag_id, task_id, mode, pipeline_id))
        if sink is not None:  # the latest take's sink: a DAG may change its sink between runs
            cur.execute("UPDATE eo_pipeline SET sink_kind = %s, sink_accumulating = %s, dead_letter_table = %s, "
                        "sink = %s WHERE pipeline_id = %s",
                        (sink.kind, sink.accumulating, sink.dead_letter_table, sink.to_json(), pipeline_id))
        return int(row["epoch"])

    # ------------------------------------------------------------------ reads

    def store_identity(self) -> str:
        """The id its migration made (:class:`~airflow_eo.core.protocol.OffsetStore`); read once."""
        if self._identity is None:
            self.migrate()
            with self.transaction() as cur:
                cur.execute("SELECT identity FROM eo_store_identity WHERE id = 1")
                row = cur.fetchone()
            if row is None:
                raise OperationError("the offset store has no identity row (eo_store_identity): its migration 'the "
                                     "store's identity' did not run to its end; run any `airflow eo` command to "
                                     "migrate it")
            self._identity = str(row["identity"])
        return self._identity

    def take_pipeline(self, pipeline_id: str, owner: Owner | None = None, sink: SinkRecord | None = None) -> int:
        self.migrate()
        with self.transaction() as cur:
            # refused: no epoch moved, nobody fenced; else the row stays locked, so the new epoch is the next one
            epoch = self._claim(cur, pipeline_id, owner, "continuous", sink) + 1
            cur.execute(f"UPDATE eo_pipeline SET epoch = %s, taken_at = {self.dialect.now} WHERE pipeline_id = %s",
                        (epoch, pipeline_id))
            return epoch

    def take_interval(self, pipeline_id: str, interval: Interval, owner: Owner | None = None,
                      sink: SinkRecord | None = None) -> int:
        self.migrate()
        with self.transaction() as cur:
            self._claim(cur, pipeline_id, owner, "interval", sink)
            bounds = utc_bounds(interval)
            key = ("pipeline_id", "interval_start", "interval_end")
            cur.execute(self.dialect.insert_or_increment("eo_interval", (*key, "epoch"), key), (pipeline_id, *bounds))
            cur.execute("SELECT epoch FROM eo_interval WHERE pipeline_id = %s AND interval_start = %s "
                        "AND interval_end = %s", (pipeline_id, *bounds))
            return int(_one_row(cur)["epoch"])

    def batch_for_interval(self, pipeline_id: str, interval: Interval) -> BatchRecord | None:
        rows = self._select_batches("pipeline_id = %s AND interval_start = %s AND interval_end = %s",
                                    (pipeline_id, *utc_bounds(interval)))
        return rows[0] if rows else None

    def committed_offsets(self, pipeline_id: str) -> dict[TopicPartition, int]:
        self.migrate()
        with self.transaction() as cur:
            cur.execute(
                "SELECT topic, kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                (pipeline_id,),
            )
            return {(r["topic"], r["kafka_partition"]): int(r["next_offset"]) for r in cur.fetchall()}

    def _select_batches(self, where: str, args: tuple) -> list[BatchRecord]:
        self.migrate()
        with self.transaction() as cur:
            cur.execute(f"SELECT * FROM eo_batch WHERE {where} ORDER BY batch_id", args)
            return [batch_record(row) for row in cur.fetchall()]

    def batch_for_run(self, pipeline_id: str, run_id: str) -> BatchRecord | None:
        rows = self._select_batches("pipeline_id = %s AND run_key = %s", (pipeline_id, run_id))
        return rows[0] if rows else None

    def unfinished_batches(self, pipeline_id: str) -> list[BatchRecord]:
        return self._select_batches(
            "pipeline_id = %s AND state IN (%s, %s)", (pipeline_id, *[s.value for s in UNFINISHED])
        )

    def get_batch(self, pipeline_id: str, batch_id: int) -> BatchRecord | None:
        rows = self._select_batches("pipeline_id = %s AND batch_id = %s", (pipeline_id, batch_id))
        return rows[0] if rows else None

    def latest_committed_batch_id(self, pipeline_id: str) -> int | None:
        self.migrate()
        with self.transaction() as cur:
            cur.execute("SELECT MAX(batch_id) AS b FROM eo_batch WHERE pipeline_id = %s AND state = %s",
                        (pipeline_id, BatchState.COMMITTED.value))
            row = cur.fetchone()
            return int(row["b"]) if row and row["b"] is not None else None

    # ------------------------------------------------------------------ writes (fenced)

    def insert_batch(self, pipeline_id: str, epoch: int, run_id: str, ranges: list[OffsetRange],
                     skipped: list[OffsetRange], interval: Interval | None = None) -> BatchRecord:
        repeated = repeated_partition(ranges)
        if repeated is not None:  # the planner never repeats one; its commit could not move one row twice
            raise ValueError(f"a batch of {pipeline_id!r} may name each partition once: {repeated[0]}"
                             f"[{repeated[1]}] is named twice")
        with self.transaction() as cur:
            self._fence(cur, pipeline_id, interval, epoch)
            if interval is not None:  # serialize batch-id allocation between concurrent intervals
                cur.execute(f"SELECT 1 FROM eo_pipeline WHERE pipeline_id = %s {self.dialect.exclusive_lock}",
                            (pipeline_id,))
            cur.execute("SELECT COALESCE(MAX(batch_id), -1) + 1 AS next FROM eo_batch WHERE pipeline_id = %s",
                        (pipeline_id,))
            batch_id = int(_one_row(cur)["next"])
            # Continuous batches are unique per run, interval batches per interval.
            run_key, bounds = (run_id, (None, None)) if interval is None else (None, utc_bounds(interval))
            cur.execute(
                "INSERT INTO eo_batch (pipeline_id, batch_id, run_id, run_key, interval_start, interval_end, epoch, "
                "state, ranges, skipped) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (pipeline_id, batch_id, run_id, run_key, *bounds, epoch, BatchState.PLANNED.value,
                 ranges_to_json(ranges), ranges_to_json(skipped)),
            )
        return BatchRecord(pipeline_id, batch_id, run_id, epoch, BatchState.PLANNED, sorted(ranges),
                           sorted(skipped), interval=interval)

    def _transition(self, cur: Any, batch: BatchRecord, epoch: int, target: BatchState,
                    extra_sql: str = "", extra_args: tuple = ()) -> None:
        if not can_transition(batch.state, target):
            raise CommitConflictError(
                f"batch {batch.batch_id} of {batch.pipeline_id!r} cannot go from {batch.state.value} "
                f"to {target.value}"
            )
        sources = [s.value for s in BatchState if can_transition(s, target)]
        cur.execute(
            f"UPDATE eo_batch SET state = %s, epoch = %s, updated_at = {self.dialect.now}{extra_sql} "
            f"WHERE pipeline_id = %s AND batch_id = %s AND state IN ({', '.join(['%s'] * len(sources))})",
            (target.value, epoch, *extra_args, batch.pipeline_id, batch.batch_id, *sources),
        )
        if cur.rowcount != 1:
            raise CommitConflictError(
                f"batch {batch.batch_id} of {batch.pipeline_id!r} is no longer "
                f"{' or '.join(sources)}; another attempt finished or aborted it"
            )

    def adopt_batch(self, batch: BatchRecord, epoch: int) -> BatchRecord:
        """A retry takes over its run's unfinished batch; earlier xids are void (rolled back)."""
        with self.transaction() as cur:
            self._fence(cur, batch.pipeline_id, batch.interval, epoch)
            cur.execute(
                f"UPDATE eo_batch SET epoch = %s, state = %s, xids = NULL, updated_at = {self.dialect.now} "
                "WHERE pipeline_id = %s AND batch_id = %s AND state IN (%s, %s)",
                (epoch, BatchState.PLANNED.value, batch.pipeline_id, batch.batch_id,
                 *[s.value for s in UNFINISHED]),
            )
            if cur.rowcount != 1:
                raise CommitConflictError(f"batch {batch.batch_id} of {batch.pipeline_id!r} changed "
                                          "while this attempt resumed it")
        return BatchRecord(batch.pipeline_id, batch.batch_id, batch.run_id, epoch, BatchState.PLANNED,
                           batch.ranges, batch.skipped, interval=batch.interval)

    def mark_prepared(self, batch: BatchRecord, epoch: int, xids: list[str]) -> None:
        with self.transaction() as cur:
            self._fence(cur, batch.pipeline_id, batch.interval, epoch)
            self._transition(cur, batch, epoch, BatchState.PREPARED, ", xids = %s", (json.dumps(xids),))

    def abort_batch(self, batch: BatchRecord, epoch: int) -> None:
        with self.transaction() as cur:
            self._fence(cur, batch.pipeline_id, batch.interval, epoch)
            # run_key NULL frees the run to plan a fresh batch if it is cleared later.
            self._transition(cur, batch, epoch, BatchState.ABORTED, ", run_key = NULL")

    def commit_batch(self, batch: BatchRecord, epoch: int, summary: BatchSummary) -> None:
        """THE commit point: CAS every partition's offset and the batch state, in one transaction."""
        with self.transaction() as cur:
            self._fence(cur, batch.pipeline_id, batch.interval, epoch)
            if batch.interval is None:  # interval batches have no running position: their identity is the interval
                advance_offsets(cur, self.dialect, batch)
            self._transition(
                cur, batch, epoch, BatchState.COMMITTED,
                f", committed_at = {self.dialect.now}, records_in = %s, rows_out = %s, "
                "dead_letters = %s, summary = %s",
                (summary.records_in, summary.rows_out, summary.dead_letters, json.dumps(summary.to_dict())),
            )
            failpoint("in_store_commit")

    def record_replay(self, batch: BatchRecord, epoch: int, summary: BatchSummary) -> None:
        """Interval mode: a committed interval was replayed; it stays committed, its summary is the replay's."""
        assert batch.interval is not None
        with self.transaction() as cur:
            self._fence(cur, batch.pipeline_id, batch.interval, epoch)
            cur.execute(
                "UPDATE eo_batch SET epoch = %s, summary = %s, records_in = %s, rows_out = %s, dead_letters = %s, "
                f"updated_at = {self.dialect.now} WHERE pipeline_id = %s AND batch_id = %s AND state = %s",
                (epoch, json.dumps(summary.to_dict()), summary.records_in, summary.rows_out, summary.dead_letters,
                 batch.pipeline_id, batch.batch_id, BatchState.COMMITTED.value),
            )
            if cur.rowcount != 1:
                raise CommitConflictError(f"batch {batch.batch_id} of {batch.pipeline_id!r} is no longer committed")


def _one_row(cur: Any) -> dict[str, Any]:
    """The row of a query that always returns exactly one: an aggregate, or a row this transaction wrote.

    :param cur: the cursor the query ran on.
    """
    row = cur.fetchone()
    assert row is not None, "the query returns exactly one row"
    return row
