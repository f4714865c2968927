"""The durable offset store on MySQL / MariaDB (DESIGN §2).

Three tables: ``eo_pipeline`` (fencing epoch), ``eo_batch`` (the batch log: Spark's
offset log and commit log in one) and ``eo_offset`` (committed position per
partition). Every write after :meth:`take_pipeline` checks the caller's epoch under
a lock on the pipeline row, and the commit point is one local transaction of
compare-and-sets (:meth:`commit_batch`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT

from airflow_eo.core.errors import CommitConflictError, ConfigurationError, FencedError
from airflow_eo.core.protocol import BatchRecord
from airflow_eo.core.ranges import OffsetRange, TopicPartition, batch_starts, ranges_from_json, ranges_to_json
from airflow_eo.core.states import UNFINISHED, BatchState, can_transition

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
]


class OffsetStore:
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
        conn = pymysql.connect(
            **self._connect_kwargs,
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
                        cur.execute(statement)
                    cur.execute("INSERT INTO eo_schema_version (version) VALUES (%s)", (version,))
            finally:
                cur.execute("DO RELEASE_LOCK('airflow_eo_migrate')")
        self._migrated = True

    def _lock_epoch(self, cur: Any, pipeline_id: str, epoch: int) -> None:
        """Fence: lock the pipeline row and check it still carries our epoch."""
        cur.execute("SELECT epoch FROM eo_pipeline WHERE pipeline_id = %s FOR UPDATE", (pipeline_id,))
        row = cur.fetchone()
        current = row["epoch"] if row else None
        if current != epoch:
            raise FencedError(
                f"pipeline {pipeline_id!r}: this attempt holds epoch {epoch} but a newer attempt "
                f"took the pipeline (epoch {current}); this attempt stops without committing"
            )

    # ------------------------------------------------------------------ reads

    def take_pipeline(self, pipeline_id: str) -> int:
        self.migrate()
        with self.transaction() as cur:
            cur.execute(
                "INSERT INTO eo_pipeline (pipeline_id, epoch) VALUES (%s, 1) "
                "ON DUPLICATE KEY UPDATE epoch = epoch + 1, taken_at = CURRENT_TIMESTAMP(3)",
                (pipeline_id,),
            )
            cur.execute("SELECT epoch FROM eo_pipeline WHERE pipeline_id = %s", (pipeline_id,))
            return int(cur.fetchone()["epoch"])

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

    def insert_batch(self, pipeline_id: str, epoch: int, run_id: str,
                     ranges: list[OffsetRange], skipped: list[OffsetRange]) -> BatchRecord:
        with self.transaction() as cur:
            self._lock_epoch(cur, pipeline_id, epoch)
            cur.execute("SELECT COALESCE(MAX(batch_id), -1) + 1 AS next FROM eo_batch WHERE pipeline_id = %s",
                        (pipeline_id,))
            batch_id = int(cur.fetchone()["next"])
            cur.execute(
                "INSERT INTO eo_batch (pipeline_id, batch_id, run_id, run_key, epoch, state, ranges, skipped) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (pipeline_id, batch_id, run_id, run_id, epoch, BatchState.PLANNED.value,
                 ranges_to_json(ranges), ranges_to_json(skipped)),
            )
        return BatchRecord(pipeline_id, batch_id, run_id, epoch, BatchState.PLANNED, sorted(ranges),
                           sorted(skipped))

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
            self._lock_epoch(cur, batch.pipeline_id, epoch)
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
                           batch.ranges, batch.skipped)

    def mark_prepared(self, batch: BatchRecord, epoch: int, xids: list[str]) -> None:
        with self.transaction() as cur:
            self._lock_epoch(cur, batch.pipeline_id, epoch)
            self._transition(cur, batch, epoch, BatchState.PREPARED, ", xids = %s", (json.dumps(xids),))

    def abort_batch(self, batch: BatchRecord, epoch: int) -> None:
        with self.transaction() as cur:
            self._lock_epoch(cur, batch.pipeline_id, epoch)
            # run_key NULL frees the run to plan a fresh batch if it is cleared later.
            self._transition(cur, batch, epoch, BatchState.ABORTED, ", run_key = NULL")

    def commit_batch(self, batch: BatchRecord, epoch: int, summary: dict[str, Any]) -> None:
        """THE commit point: CAS every partition's offset and the batch state, in one transaction."""
        with self.transaction() as cur:
            self._lock_epoch(cur, batch.pipeline_id, epoch)
            starts = batch_starts(batch.ranges, batch.skipped)
            for r in batch.ranges:
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
                (summary.get("records_in"), summary.get("rows_out"), summary.get("dead_letters"),
                 json.dumps(summary)),
            )


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
        summary=json.loads(row["summary"]) if row["summary"] else None,
    )


def connect_kwargs_from_uri(uri: str) -> dict[str, Any]:
    """``mysql://user:password@host:port/database`` → pymysql keyword arguments (dev tools, tests)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    if parts.scheme not in ("mysql", "mariadb") or not parts.hostname:
        raise ConfigurationError(f"not a mysql:// URI: {parts.scheme}://{parts.hostname or ''}")
    return {
        "host": parts.hostname,
        "port": parts.port or 3306,
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "database": unquote(parts.path.lstrip("/")) or None,
    }


