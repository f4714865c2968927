"""The durable offset store on MySQL / MariaDB (``docs/architecture.md``, "The offset store").

Three tables: ``eo_pipeline`` (fencing epoch), ``eo_batch`` (the batch log: Spark's
offset log and commit log in one) and ``eo_offset`` (committed position per
partition). Every write after :meth:`take_pipeline` checks the caller's epoch under
a lock on the pipeline row, and the commit point is one local transaction of
compare-and-sets (:meth:`commit_batch`). ``eo_interval`` fences interval-mode
batches; ``eo_audit`` records what people did to a pipeline (``airflow eo rewind``,
``recover``), and the reads at the end serve those operations (``airflow_eo/operations.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT

from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import (
    CommitConflictError,
    FencedError,
    OperationError,
    PipelineConflictError,
    UnknownPipelineError,
)
from airflow_eo.core.faults import crash_if
from airflow_eo.core.identifiers import quote_identifier
from airflow_eo.core.planning import Interval
from airflow_eo.core.protocol import BatchRecord, BatchSummary
from airflow_eo.core.ranges import OffsetRange, TopicPartition, batch_starts, ranges_from_json, ranges_to_json
from airflow_eo.core.rewind import RewindPlan
from airflow_eo.core.states import UNFINISHED, BatchState, can_transition
from airflow_eo.core.status import AuditEntry, BatchInfo, PipelineInfo
from airflow_eo.mysql import connection as mysql_connection

# Versioned migrations: (version, statements). Append only; each statement is idempotent.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        """CREATE TABLE IF NOT EXISTS eo_pipeline (
            pipeline_id VARCHAR(190) NOT NULL PRIMARY KEY,
            epoch BIGINT NOT NULL,
            created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            taken_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        ) ENGINE=InnoDB""",
        """CREATE TABLE IF NOT EXISTS eo_batch (
            pipeline_id VARCHAR(190) NOT NULL,
            batch_id BIGINT NOT NULL,
            run_id VARCHAR(250) NOT NULL,
            run_key VARCHAR(250) NULL,
            interval_start TIMESTAMP(3) NULL,
            interval_end TIMESTAMP(3) NULL,
            epoch BIGINT NOT NULL,
            state VARCHAR(16) NOT NULL,
            ranges JSON NOT NULL,
            skipped JSON NULL,
            xids JSON NULL,
            records_in BIGINT NULL,
            rows_out BIGINT NULL,
            dead_letters BIGINT NULL,
            summary JSON NULL,
            created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            committed_at TIMESTAMP(3) NULL,
            PRIMARY KEY (pipeline_id, batch_id),
            UNIQUE KEY eo_batch_run (pipeline_id, run_key),
            UNIQUE KEY eo_batch_interval (pipeline_id, interval_start, interval_end),
            KEY eo_batch_state (pipeline_id, state)
        ) ENGINE=InnoDB""",
        """CREATE TABLE IF NOT EXISTS eo_offset (
            pipeline_id VARCHAR(190) NOT NULL,
            topic VARCHAR(249) NOT NULL,
            kafka_partition INT NOT NULL,
            next_offset BIGINT NOT NULL,
            batch_id BIGINT NOT NULL,
            PRIMARY KEY (pipeline_id, topic, kafka_partition)
        ) ENGINE=InnoDB""",
    ]),
    (2, [
        # Who runs the pipeline (``<dag_id>.<task_id>``) and in which mode: a second DAG
        # declaring the same pipeline id is refused instead of splitting its offsets.
        "ALTER TABLE eo_pipeline ADD COLUMN owner VARCHAR(250) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN mode VARCHAR(16) NULL",
        # Interval bounds are UTC; DATETIME has no 2038 limit and no session time-zone conversion.
        "ALTER TABLE eo_batch MODIFY interval_start DATETIME(3) NULL, MODIFY interval_end DATETIME(3) NULL",
        # Interval mode fences per interval, so a backfill's concurrent runs don't fence each other.
        """CREATE TABLE IF NOT EXISTS eo_interval (
            pipeline_id VARCHAR(190) NOT NULL,
            interval_start DATETIME(3) NOT NULL,
            interval_end DATETIME(3) NOT NULL,
            epoch BIGINT NOT NULL,
            taken_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            PRIMARY KEY (pipeline_id, interval_start, interval_end)
        ) ENGINE=InnoDB""",
    ]),
    (3, [
        # The sink, recorded at every take, so that operations (``airflow eo``) know it without the DAG:
        # whether a rewind would double count, where dead letters go, how to rebuild it for recovery.
        "ALTER TABLE eo_pipeline ADD COLUMN sink_kind VARCHAR(64) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN sink_accumulating BOOLEAN NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN dead_letter_table VARCHAR(130) NULL",
        "ALTER TABLE eo_pipeline ADD COLUMN sink JSON NULL",
        # What people did to a pipeline (rewinds, recoveries): who, when, why, and what changed.
        """CREATE TABLE IF NOT EXISTS eo_audit (
            audit_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            pipeline_id VARCHAR(190) NOT NULL,
            created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            actor VARCHAR(250) NOT NULL,
            action VARCHAR(32) NOT NULL,
            reason TEXT NULL,
            epoch BIGINT NULL,
            details JSON NULL,
            KEY eo_audit_pipeline (pipeline_id, audit_id)
        ) ENGINE=InnoDB""",
    ]),
]

@dataclass(frozen=True)
class EpochFence:
    """The row that holds a pipeline's fencing epoch (in interval mode: the interval's), and the
    check that an attempt's epoch still holds it.

    The store's own writes lock it ``FOR UPDATE``. An upsert sink on the same server reads it
    with a shared lock at the start of each of its transactions (``LOCK IN SHARE MODE``): a take
    (``epoch += 1``) then waits for the writes in flight, and every later write of an older
    attempt, such as a zombie executor's, aborts. Picklable: it travels to the executors.

    :param database: qualifies the table, for a connection whose default database is another.
    """

    pipeline_id: str
    epoch: int
    interval: Interval | None = None
    database: str | None = None

    def query(self, lock: str) -> tuple[str, tuple[Any, ...]]:
        prefix = f"{quote_identifier(self.database, 'database name')}." if self.database else ""
        if self.interval is None:
            return (f"SELECT epoch FROM {prefix}eo_pipeline WHERE pipeline_id = %s {lock}", (self.pipeline_id,))
        return (f"SELECT epoch FROM {prefix}eo_interval WHERE pipeline_id = %s AND interval_start = %s "
                f"AND interval_end = %s {lock}", (self.pipeline_id, *_utc_bounds(self.interval)))

    def check(self, cur: Any, lock: str) -> None:
        """Lock the epoch row (``lock``: ``FOR UPDATE`` or ``LOCK IN SHARE MODE``); FencedError unless it holds ours."""
        cur.execute(*self.query(lock))
        row = cur.fetchone()
        current = None if row is None else (row["epoch"] if isinstance(row, dict) else row[0])
        if current != self.epoch:
            holder = f"pipeline {self.pipeline_id!r}" + (f" interval {self.interval}" if self.interval else "")
            taker = "took the pipeline" if self.interval is None else "of the same interval took it"
            raise FencedError(
                f"{holder}: this attempt holds epoch {self.epoch} but a newer attempt {taker} "
                f"(epoch {current}); this attempt stops without committing"
            )


# A migration interrupted after an ALTER (DDL commits on its own) is re-run: these are "already done".
_ALREADY_APPLIED = {1050, 1060}  # table exists, duplicate column


class MySqlOffsetStore:
    """pymysql implementation of :class:`airflow_eo.core.protocol.OffsetStore`.

    :param connect_kwargs: keyword arguments for ``pymysql.connect`` (from an Airflow
        ``mysql`` connection, see :class:`airflow_eo.hooks.OffsetStoreHook`).
    """

    def __init__(self, connect_kwargs: dict[str, Any]) -> None:
        self._connect_kwargs = connect_kwargs
        self._migrated = False

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def transaction(self) -> Iterator[pymysql.cursors.DictCursor]:
        """One connection, one transaction: committed on success, rolled back on error."""
        conn = mysql_connection.connect(
            self._connect_kwargs,
            autocommit=False,
            cursorclass=pymysql.cursors.DictCursor,
            # Affected rows = matched rows, so a compare-and-set that rewrites an
            # unchanged value (an empty range) still counts as a match.
            client_flag=CLIENT.FOUND_ROWS,
        )
        try:
            with conn.cursor() as cur:
                yield cur
            conn.commit()
        except BaseException:
            # Best effort: on a lost connection (the server crashed) the server rolls back by itself,
            # and a failing ROLLBACK must not hide the error that says what happened.
            with suppress(pymysql.err.MySQLError):
                conn.rollback()
            raise
        finally:
            conn.close()

    def migrate(self) -> None:
        if self._migrated:
            return
        with self.transaction() as cur:
            # Serialize concurrent migrators (two DAGs starting at once).
            cur.execute("SELECT GET_LOCK('airflow_eo_migrate', 60) AS got")
            try:
                cur.execute("CREATE TABLE IF NOT EXISTS eo_schema_version (version INT NOT NULL PRIMARY KEY)")
                cur.execute("SELECT version FROM eo_schema_version")
                applied = {row["version"] for row in cur.fetchall()}
                for version, statements in MIGRATIONS:
                    if version in applied:
                        continue
                    for statement in statements:
                        try:
                            cur.execute(statement)
                        except pymysql.err.MySQLError as exc:
                            if not exc.args or exc.args[0] not in _ALREADY_APPLIED:
                                raise
                    cur.execute("INSERT INTO eo_schema_version (version) VALUES (%s)", (version,))
            finally:
                cur.execute("DO RELEASE_LOCK('airflow_eo_migrate')")
        self._migrated = True

    def _fence(self, cur: Any, pipeline_id: str, interval: Interval | None, epoch: int) -> None:
        """Lock the row holding the fencing epoch (the pipeline's, or in interval mode the interval's)
        and check it still carries ours."""
        EpochFence(pipeline_id, epoch, interval).check(cur, "FOR UPDATE")

    def _claim(self, cur: Any, pipeline_id: str, owner: str | None, mode: str, sink: SinkRecord | None) -> None:
        """Lock (creating it if new) the pipeline row; refuse a second owner or another mode; record the sink."""
        cur.execute("INSERT IGNORE INTO eo_pipeline (pipeline_id, epoch) VALUES (%s, 0)", (pipeline_id,))
        cur.execute("SELECT owner, mode FROM eo_pipeline WHERE pipeline_id = %s FOR UPDATE", (pipeline_id,))
        row = cur.fetchone()
        if owner and row["owner"] and row["owner"] != owner:
            raise PipelineConflictError(
                f"pipeline id {pipeline_id!r} belongs to {row['owner']}, and {owner} declares the same "
                "pipeline id: two tasks sharing one pipeline would split its offsets between them. Give one "
                "of them its own pipeline_id=. To move the pipeline to the new task on purpose, clear its "
                f"owner in the offset store: UPDATE eo_pipeline SET owner = NULL WHERE pipeline_id = '{pipeline_id}'"
            )
        if row["mode"] and row["mode"] != mode:
            raise PipelineConflictError(
                f"pipeline id {pipeline_id!r} ran in {row['mode']} mode ({row['owner'] or 'owner unknown'}); "
                f"{owner or 'this task'} runs it in {mode} mode. A pipeline keeps one mode: give the "
                f"{mode}-mode task its own pipeline_id="
            )
        if (owner and not row["owner"]) or not row["mode"]:
            cur.execute("UPDATE eo_pipeline SET owner = COALESCE(owner, %s), mode = COALESCE(mode, %s) "
                        "WHERE pipeline_id = %s", (owner, mode, pipeline_id))
        if sink is not None:  # the latest take's sink: a DAG may change its sink between runs
            cur.execute("UPDATE eo_pipeline SET sink_kind = %s, sink_accumulating = %s, dead_letter_table = %s, "
                        "sink = %s WHERE pipeline_id = %s",
                        (sink.kind, sink.accumulating, sink.dead_letter_table, sink.to_json(), pipeline_id))

    # ------------------------------------------------------------------ reads

    def take_pipeline(self, pipeline_id: str, owner: str | None = None, sink: SinkRecord | None = None) -> int:
        self.migrate()
        with self.transaction() as cur:
            self._claim(cur, pipeline_id, owner, "continuous", sink)  # refused: no epoch moved, nobody fenced
            cur.execute(
                "UPDATE eo_pipeline SET epoch = epoch + 1, taken_at = CURRENT_TIMESTAMP(3) WHERE pipeline_id = %s",
                (pipeline_id,),
            )
            cur.execute("SELECT epoch FROM eo_pipeline WHERE pipeline_id = %s", (pipeline_id,))
            return int(_one_row(cur)["epoch"])

    def take_interval(self, pipeline_id: str, interval: Interval, owner: str | None = None,
                      sink: SinkRecord | None = None) -> int:
        self.migrate()
        with self.transaction() as cur:
            self._claim(cur, pipeline_id, owner, "interval", sink)
            bounds = _utc_bounds(interval)
            cur.execute(
                "INSERT INTO eo_interval (pipeline_id, interval_start, interval_end, epoch) VALUES (%s, %s, %s, 1) "
                "ON DUPLICATE KEY UPDATE epoch = epoch + 1, taken_at = CURRENT_TIMESTAMP(3)",
                (pipeline_id, *bounds),
            )
            cur.execute("SELECT epoch FROM eo_interval WHERE pipeline_id = %s AND interval_start = %s "
                        "AND interval_end = %s", (pipeline_id, *bounds))
            return int(_one_row(cur)["epoch"])

    def batch_for_interval(self, pipeline_id: str, interval: Interval) -> BatchRecord | None:
        rows = self._select_batches("pipeline_id = %s AND interval_start = %s AND interval_end = %s",
                                    (pipeline_id, *_utc_bounds(interval)))
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
            return [_record(row) for row in cur.fetchall()]

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
        with self.transaction() as cur:
            self._fence(cur, pipeline_id, interval, epoch)
            if interval is not None:  # serialize batch-id allocation between concurrent intervals
                cur.execute("SELECT 1 FROM eo_pipeline WHERE pipeline_id = %s FOR UPDATE", (pipeline_id,))
            cur.execute("SELECT COALESCE(MAX(batch_id), -1) + 1 AS next FROM eo_batch WHERE pipeline_id = %s",
                        (pipeline_id,))
            batch_id = int(_one_row(cur)["next"])
            # Continuous batches are unique per run, interval batches per interval.
            run_key, bounds = (run_id, (None, None)) if interval is None else (None, _utc_bounds(interval))
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
            f"UPDATE eo_batch SET state = %s, epoch = %s, updated_at = CURRENT_TIMESTAMP(3){extra_sql} "
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
                "UPDATE eo_batch SET epoch = %s, state = %s, xids = NULL, updated_at = CURRENT_TIMESTAMP(3) "
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
            starts = batch_starts(batch.ranges, batch.skipped)
            # Interval batches have no running position: their identity is the interval.
            for r in batch.ranges if batch.interval is None else ():
                cur.execute(
                    "UPDATE eo_offset SET next_offset = %s, batch_id = %s WHERE pipeline_id = %s "
                    "AND topic = %s AND kafka_partition = %s AND next_offset = %s",
                    (r.until_offset, batch.batch_id, batch.pipeline_id, r.topic, r.partition, starts[r.key]),
                )
                if cur.rowcount == 1:
                    continue
                cur.execute(
                    "SELECT next_offset FROM eo_offset WHERE pipeline_id = %s AND topic = %s "
                    "AND kafka_partition = %s", (batch.pipeline_id, r.topic, r.partition),
                )
                row = cur.fetchone()
                if row is not None:
                    raise CommitConflictError(
                        f"{r.topic}[{r.partition}] is committed at offset {row['next_offset']}, "
                        f"but batch {batch.batch_id} starts at {starts[r.key]}; another run moved "
                        "the offsets, nothing of this batch was committed"
                    )
                # First batch that reads this partition; a concurrent insert fails on the key.
                cur.execute(
                    "INSERT INTO eo_offset (pipeline_id, topic, kafka_partition, next_offset, batch_id) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    (batch.pipeline_id, r.topic, r.partition, r.until_offset, batch.batch_id),
                )
            self._transition(
                cur, batch, epoch, BatchState.COMMITTED,
                ", committed_at = CURRENT_TIMESTAMP(3), records_in = %s, rows_out = %s, "
                "dead_letters = %s, summary = %s",
                (summary.records_in, summary.rows_out, summary.dead_letters, json.dumps(summary.to_dict())),
            )
            crash_if("in_store_commit")


    def record_replay(self, batch: BatchRecord, epoch: int, summary: BatchSummary) -> None:
        """Interval mode: a committed interval was replayed; it stays committed, its summary is the replay's."""
        assert batch.interval is not None
        with self.transaction() as cur:
            self._fence(cur, batch.pipeline_id, batch.interval, epoch)
            cur.execute(
                "UPDATE eo_batch SET epoch = %s, summary = %s, records_in = %s, rows_out = %s, dead_letters = %s, "
                "updated_at = CURRENT_TIMESTAMP(3) WHERE pipeline_id = %s AND batch_id = %s AND state = %s",
                (epoch, json.dumps(summary.to_dict()), summary.records_in, summary.rows_out, summary.dead_letters,
                 batch.pipeline_id, batch.batch_id, BatchState.COMMITTED.value),
            )
            if cur.rowcount != 1:
                raise CommitConflictError(f"batch {batch.batch_id} of {batch.pipeline_id!r} is no longer committed")

    # ------------------------------------------------------------------ maintenance

    def forget_pipeline(self, pipeline_id: str) -> None:
        """Delete everything the store knows of a pipeline: its next run starts as a new pipeline.

        Not fenced: a running attempt of the pipeline fails at its next store write. The sink's
        rows and any prepared XA branches are the caller's to clear.
        """
        self.migrate()
        with self.transaction() as cur:
            for table in ("eo_offset", "eo_batch", "eo_interval", "eo_audit", "eo_pipeline"):
                cur.execute(f"DELETE FROM {table} WHERE pipeline_id = %s", (pipeline_id,))


    # ------------------------------------------------------------------ operations (``airflow eo``)

    @contextmanager
    def _utc_reads(self) -> Iterator[pymysql.cursors.DictCursor]:
        """A transaction whose TIMESTAMP columns read as UTC (the session's time zone converts them)."""
        self.migrate()
        with self.transaction() as cur:
            cur.execute("SET time_zone = '+00:00'")
            yield cur

    def pipelines(self, pipeline_id: str | None = None) -> list[PipelineInfo]:
        """Every pipeline in the store (or the one named), sorted by id.

        :param pipeline_id: only this pipeline.
        """
        where, args = ("WHERE pipeline_id = %s", (pipeline_id,)) if pipeline_id is not None else ("", ())
        with self._utc_reads() as cur:
            cur.execute(f"SELECT pipeline_id, epoch, owner, mode, taken_at, sink FROM eo_pipeline {where} "
                        "ORDER BY pipeline_id", args)
            return [PipelineInfo(r["pipeline_id"], int(r["epoch"]), r["owner"], Mode(r["mode"]) if r["mode"] else None,
                                 _utc(r["taken_at"]), SinkRecord.from_json(r["sink"]) if r["sink"] else None)
                    for r in cur.fetchall()]

    def pipeline(self, pipeline_id: str) -> PipelineInfo:
        """The pipeline's row; :class:`UnknownPipelineError` (naming the known ones) when there is none.

        :param pipeline_id: the pipeline.
        """
        found = self.pipelines(pipeline_id)
        if found:
            return found[0]
        known = [p.pipeline_id for p in self.pipelines()]
        listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        raise UnknownPipelineError(f"the offset store has no pipeline {pipeline_id!r}; "
                                   + (f"its pipelines are: {listed}" if known else "it holds no pipeline yet"))

    def all_committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Every pipeline's committed offsets, in one query."""
        with self._utc_reads() as cur:
            cur.execute("SELECT pipeline_id, topic, kafka_partition, next_offset FROM eo_offset")
            found: dict[str, dict[TopicPartition, int]] = {}
            for r in cur.fetchall():
                found.setdefault(r["pipeline_id"], {})[(r["topic"], r["kafka_partition"])] = int(r["next_offset"])
            return found

    def latest_batches(self) -> dict[str, BatchInfo]:
        """Each pipeline's newest batch, in one query."""
        with self._utc_reads() as cur:
            cur.execute("SELECT b.* FROM eo_batch b JOIN (SELECT pipeline_id, MAX(batch_id) AS batch_id FROM eo_batch "
                        "GROUP BY pipeline_id) newest USING (pipeline_id, batch_id)")
            return {r["pipeline_id"]: _batch_info(r) for r in cur.fetchall()}

    def batch_history(self, pipeline_id: str, limit: int, batch_ids: list[int] | None = None) -> list[BatchInfo]:
        """The pipeline's batches, newest first.

        :param pipeline_id: the pipeline.
        :param limit: at most this many.
        :param batch_ids: only these batches.
        """
        where, args = "pipeline_id = %s", list[Any]([pipeline_id])
        if batch_ids is not None:
            if not batch_ids:
                return []
            where += f" AND batch_id IN ({', '.join(['%s'] * len(batch_ids))})"
            args.extend(batch_ids)
        with self._utc_reads() as cur:
            cur.execute(f"SELECT * FROM eo_batch WHERE {where} ORDER BY batch_id DESC LIMIT %s", (*args, limit))
            return [_batch_info(r) for r in cur.fetchall()]

    def audit_log(self, pipeline_id: str, limit: int) -> list[AuditEntry]:
        """What people did to the pipeline (``eo_audit``), newest first.

        :param pipeline_id: the pipeline.
        :param limit: at most this many.
        """
        with self._utc_reads() as cur:
            cur.execute("SELECT * FROM eo_audit WHERE pipeline_id = %s ORDER BY audit_id DESC LIMIT %s",
                        (pipeline_id, limit))
            return [AuditEntry(int(r["audit_id"]), r["pipeline_id"], _utc(r["created_at"]), r["actor"], r["action"],
                               r["reason"], None if r["epoch"] is None else int(r["epoch"]),
                               json.loads(r["details"]) if r["details"] else {})
                    for r in cur.fetchall()]

    def record_audit(self, pipeline_id: str, epoch: int | None, actor: str, action: str, reason: str | None,
                     details: dict[str, Any]) -> None:
        """Append an audit row (an operation that changed the pipeline, e.g. a recovery).

        :param pipeline_id: the pipeline.
        :param epoch: the epoch the operation took.
        :param actor: who ran it.
        :param action: what (``recover``, ``rewind``).
        :param reason: why, in the operator's words.
        :param details: what changed (JSON).
        """
        with self.transaction() as cur:
            _insert_audit(cur, pipeline_id, epoch, actor, action, reason, details)

    def rewind(self, plan: RewindPlan, actor: str, reason: str,
               check: Callable[[PipelineInfo, list[BatchRecord]], None]) -> int:
        """Move the pipeline's committed offsets as planned, in one transaction with the take and the audit row.

        Under the pipeline row's lock (which every fenced write of an attempt takes too): ``check`` sees the
        pipeline and its unfinished batches and may refuse; every moved offset must still be where the plan
        found it (else nothing changes); the epoch moves on (fencing any running attempt); the audit row
        records who, why, and old and new offsets. Any failure rolls all of it back.

        :param plan: the rewind (old -> new per partition).
        :param actor: who runs it.
        :param reason: why.
        :param check: the refusal rules (:func:`airflow_eo.core.rewind.check_rewind`), run under the lock.
        :return: the epoch taken.
        """
        p = plan.pipeline_id
        self.migrate()
        with self.transaction() as cur:
            cur.execute("SELECT pipeline_id, epoch, owner, mode, taken_at, sink FROM eo_pipeline "
                        "WHERE pipeline_id = %s FOR UPDATE", (p,))
            row = cur.fetchone()
            if row is None:
                raise UnknownPipelineError(f"the offset store has no pipeline {p!r}")
            info = PipelineInfo(p, int(row["epoch"]), row["owner"], Mode(row["mode"]) if row["mode"] else None,
                                row["taken_at"], SinkRecord.from_json(row["sink"]) if row["sink"] else None)
            cur.execute("SELECT * FROM eo_batch WHERE pipeline_id = %s AND state IN (%s, %s) ORDER BY batch_id",
                        (p, *[s.value for s in UNFINISHED]))
            check(info, [_record(r) for r in cur.fetchall()])
            for change in plan.moved:
                if change.old is None:  # never committed: the next batch would start at starting_offsets
                    cur.execute("INSERT IGNORE INTO eo_offset (pipeline_id, topic, kafka_partition, next_offset, "
                                "batch_id) VALUES (%s, %s, %s, %s, -1)",
                                (p, change.topic, change.partition, change.new))
                else:
                    cur.execute("UPDATE eo_offset SET next_offset = %s WHERE pipeline_id = %s AND topic = %s AND "
                                "kafka_partition = %s AND next_offset = %s",
                                (change.new, p, change.topic, change.partition, change.old))
                if cur.rowcount != 1:
                    raise OperationError(f"{change.topic}[{change.partition}] of pipeline {p!r} moved since the "
                                         "rewind was planned (a batch committed meanwhile); nothing was changed: "
                                         "run the command again")
            cur.execute("UPDATE eo_pipeline SET epoch = epoch + 1, taken_at = CURRENT_TIMESTAMP(3) "
                        "WHERE pipeline_id = %s", (p,))
            epoch = info.epoch + 1
            _insert_audit(cur, p, epoch, actor, "rewind", reason, plan.to_dict())
            return epoch


def _insert_audit(cur: Any, pipeline_id: str, epoch: int | None, actor: str, action: str, reason: str | None,
                  details: dict[str, Any]) -> None:
    cur.execute("INSERT INTO eo_audit (pipeline_id, actor, action, reason, epoch, details) "
                "VALUES (%s, %s, %s, %s, %s, %s)", (pipeline_id, actor, action, reason, epoch, json.dumps(details)))


def _utc(value: datetime | None) -> datetime | None:
    """A TIMESTAMP read in a UTC session, as an aware datetime."""
    return None if value is None else value.replace(tzinfo=timezone.utc)


def _batch_info(row: dict[str, Any]) -> BatchInfo:
    return BatchInfo(_record(row), _utc(row["created_at"]), _utc(row["updated_at"]), _utc(row["committed_at"]))


def _one_row(cur: pymysql.cursors.DictCursor) -> dict[str, Any]:
    """The row of a query that always returns exactly one: an aggregate, or a row this transaction wrote.

    :param cur: the cursor the query ran on.
    """
    row = cur.fetchone()
    assert row is not None, "the query returns exactly one row"
    return row


def _utc_bounds(interval: Interval) -> tuple[datetime, datetime]:
    """Naive UTC datetimes for DATETIME columns (no session time-zone involved)."""
    return interval.start.replace(tzinfo=None), interval.end.replace(tzinfo=None)


def _record(row: dict[str, Any]) -> BatchRecord:
    return BatchRecord(
        pipeline_id=row["pipeline_id"],
        batch_id=int(row["batch_id"]),
        run_id=row["run_id"],
        epoch=int(row["epoch"]),
        state=BatchState(row["state"]),
        ranges=ranges_from_json(row["ranges"]),
        skipped=ranges_from_json(row["skipped"]),
        xids=json.loads(row["xids"]) if row["xids"] else [],
        summary=BatchSummary.from_dict(json.loads(row["summary"])) if row["summary"] else None,
        interval=(Interval(row["interval_start"].replace(tzinfo=timezone.utc),
                           row["interval_end"].replace(tzinfo=timezone.utc))
                  if row["interval_start"] is not None else None),
    )
