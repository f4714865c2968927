"""The partition writer: one Spark task's rows into the table (executor side; picklable, no airflow_eo install needed
beyond what the job ships). In XA mode the whole partition is one branch, prepared and reported."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pymysql
from pymysql.constants import ER

from airflow_eo.arrow.kept_batches import KeptBatches
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.refused_rows import ROW_LOCK_WAIT_S, refusal_text
from airflow_eo.core.vote import write_while_voting
from airflow_eo.mysql.bulk_load import (
    hex_columns,
    kept_csv_files,
    load_replacing,
    sink_array,
    stage,
    staging_types,
)
from airflow_eo.mysql.connection import connect, read_committed_writes
from airflow_eo.mysql.database import DATABASE
from airflow_eo.mysql.sql import (
    delete_statement,
    delete_tombstones_statement,
    tombstones_table_ddl,
    upsert_after_tombstones_statement,
    upsert_from_staging_statement,
    upsert_statement,
)
from airflow_eo.mysql.xa import XaFacade
from airflow_eo.sqlsink.writer import SqlPartitionWriter, nonempty, rollback_earlier_attempts

# Characters of values per multi-row statement (at most 4 bytes each in utf8mb4: 8 MiB).
STATEMENT_MAX_CHARS = 2 * 1024 * 1024

# The tasks of one batch write the same table at once, and InnoDB's next-key locks (an upsert of a row that exists,
# a delete of one that does not) reach into key ranges the other tasks insert into: the server then picks one
# transaction as a deadlock's victim and rolls it back, whole (seen: 2 in 16 runs of the tombstones test). A lock
# wait timeout rolls back only its statement. Either way the transaction is rolled back and run again, as InnoDB's
# manual asks of every application; Spark cannot retry one task of a barrier stage.
RESTARTABLE = frozenset({ER.LOCK_DEADLOCK, ER.LOCK_WAIT_TIMEOUT})
# An XA branch that waited out a lock is not run again: the lock may be another task's prepared branch, held until
# the batch commits (a value of a unique index in both tasks' rows: core/refused_rows.py); the driver finds out.
XA_RESTARTABLE = frozenset({ER.LOCK_DEADLOCK})
TRANSACTION_RUNS = 6

# The server's errors that refuse a row's values (in strict mode): what a dead letter can hold instead of the row.
REFUSED_VALUE_ERRORS = frozenset({
    ER.BAD_NULL_ERROR, ER.DUP_ENTRY, ER.DATA_TOO_LONG, ER.WARN_DATA_OUT_OF_RANGE, ER.WARN_DATA_TRUNCATED,
    ER.TRUNCATED_WRONG_VALUE, ER.TRUNCATED_WRONG_VALUE_FOR_FIELD, ER.NO_REFERENCED_ROW, ER.NO_REFERENCED_ROW_2,
    ER.ROW_IS_REFERENCED, ER.ROW_IS_REFERENCED_2, ER.WARN_NULL_TO_NOTNULL,
    ER.DIVISION_BY_ZERO,
    1644,  # ER_SIGNAL_EXCEPTION: a trigger's SIGNAL
    1690,  # ER_DATA_OUT_OF_RANGE: an "add" beyond the column's type
    3819,  # MySQL 8's ER_CHECK_CONSTRAINT_VIOLATED
    4025,  # MariaDB's ER_CONSTRAINT_FAILED (CHECK constraints, JSON columns' JSON_VALID)
    3140,  # MySQL 8's ER_INVALID_JSON_TEXT (a JSON column)
})


def restarting(run: Callable[[], int], restart: Callable[[], None], runs: int = TRANSACTION_RUNS,
               restartable: frozenset[int] = RESTARTABLE) -> int:
    """``run()`` (one transaction's statements); after a deadlock or a lock wait timeout (``restartable``),
    ``restart()`` (roll the transaction back, begin again) and run it again after a random pause, at most ``runs``
    times in all."""
    for attempt in range(1, runs + 1):
        try:
            return run()
        except pymysql.err.OperationalError as exc:
            if not (exc.args and exc.args[0] in restartable) or attempt == runs:
                raise
        restart()
        time.sleep(random.uniform(0, 0.05 * 2 ** attempt))  # apart, so the same two do not meet again at once
    raise AssertionError("unreachable")


@dataclass(frozen=True, kw_only=True)
class PartitionWriter(SqlPartitionWriter):
    """Writes one Spark partition; runs inside a Spark task (must stay picklable)."""

    row_alias: bool
    rows_per_statement: int
    xa: bool
    #: LOAD DATA LOCAL INFILE into a staging table + one INSERT .. SELECT, for columns of types it reads back exactly
    bulk_load: bool = False
    #: the bulk load goes straight into the table with LOAD DATA .. REPLACE, no staging table (the sink decided that
    #: replacing a row whole equals its upsert: ``mysql.table_shape.why_replace_is_not_upsert``)
    replace_rows: bool = False
    #: columns the replacing load sets to the load's time (the dead-letter table's ``created_at``)
    stamped: tuple[str, ...] = ()

    def __call__(self, batches: Iterable[pa.RecordBatch], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        found = nonempty(batches)
        if found is None:
            return None, 0  # nothing to write: no branch at all
        first, stream = found
        types = staging_types(first.schema, self.columns) if self.bulk_load else None
        if agreed is not None and types is None:
            raise RuntimeError("a writer without bulk load cannot hold its rows (can_hold_writes said no)")
        # Explicit transactions: an XA branch, or upsert transactions that each end with a commit (fenced: the
        # epoch's shared lock lasts until then).
        conn = connect(self.connect_kwargs, autocommit=False, charset="utf8mb4", local_infile=types is not None)
        try:
            xa = XaFacade(conn) if self.xa else None
            xid = self.xid(partition, stage_id, attempt_id)
            if xa is not None:
                # In autocommit for a moment, before the branch starts: with autocommit off MariaDB refuses XA
                # ROLLBACK of another session's branch with XAER_OUTSIDE, even right after connecting (checked on
                # 10.11). (A session of its own for it cost a connection per task.)
                conn.autocommit(True)
                rollback_earlier_attempts(xa, xid)
                conn.autocommit(False)
            # A branch waits out another's lock at most ROW_LOCK_WAIT_S, then fails (XA_RESTARTABLE says why).
            branch = xa is not None and not self.probe
            restartable = XA_RESTARTABLE if branch else RESTARTABLE
            with conn.cursor() as cur:
                read_committed_writes(cur)
                if branch:
                    cur.execute(DATABASE.row_lock_wait(ROW_LOCK_WAIT_S))
                failpoint("task_write")  # tests: an executor held back while newer attempts commit, or lost
                hexed = hex_columns(types) if types is not None else frozenset()
                write: Callable[[bool], int]

                def restart() -> None:
                    if xa is not None and not self.probe:
                        xa.restart(xid)
                    else:
                        conn.rollback()

                if types is None and xa is not None and not self.probe:
                    # A deadlock's victim loses its whole branch: its rows are kept on the local disk as they are
                    # written, so that the branch, started again, writes them all again from the first.
                    def write(commit: bool) -> int:
                        with KeptBatches(stream) as kept:
                            return restarting(lambda: self._write(conn, cur, _rows(kept.batches(), self.columns)),
                                              restart, restartable=restartable)
                elif types is None:
                    def write(commit: bool) -> int:
                        return self._write(conn, cur, _rows(stream, self.columns))
                elif self.replace_rows and "FLOAT" not in types:
                    # (A float32's shortest text means another number in a DOUBLE column: staged as FLOAT, it does not.)
                    def write(commit: bool) -> int:
                        with kept_csv_files(stream, self.columns, sort_by=self.key_columns) as files:
                            return restarting(lambda: self._load_replacing(conn, cur, files, hexed, commit), restart,
                                              restartable=restartable)
                else:
                    # Before XA START: session-private rows that belong to no branch and no transaction.
                    staged = stage(cur, stream, self.columns, types)
                    if DELETE_COLUMN in self.columns:
                        cur.execute(tombstones_table_ddl(self.columns, self.key_columns, types))
                    conn.commit()

                    def write(commit: bool) -> int:
                        # The staged rows stay (committed before the transaction): the statements can run again.
                        return restarting(lambda: self._write_staged(conn, cur, staged, hexed, commit), restart,
                                          restartable=restartable)
                if self.probe:  # one plain transaction, rolled back: no branch, nothing anyone sees
                    written = write(False)
                    conn.rollback()
                    return None, written
                if agreed is not None:  # held: written uncommitted while the tasks vote, committed if all agree
                    clean, written = write_while_voting(agreed, lambda: write(False))
                    if not clean:
                        conn.rollback()  # another partition found a bad record: nothing of this one is visible
                        return None, 0
                    conn.commit()
                    return None, written
                if xa is not None:
                    xa.start(xid)
                written = write(True)
                if xa is not None:
                    xa.prepare(xid)
                    return xid.encode(), written
            return None, written
        finally:
            conn.close()  # a prepared branch survives this (checked: keeps_prepared_xa)

    def lock_waited(self, exc: BaseException) -> bool:
        return (self.xa and not self.probe and isinstance(exc, pymysql.err.OperationalError) and bool(exc.args)
                and exc.args[0] == ER.LOCK_WAIT_TIMEOUT)

    def refusal(self, exc: BaseException) -> str | None:
        if isinstance(exc, pymysql.err.MySQLError) and len(exc.args) > 1 and exc.args[0] in REFUSED_VALUE_ERRORS:
            return refusal_text(f"{exc.args[1]} (MySQL error {exc.args[0]})")
        return None

    def _load_replacing(self, conn: pymysql.connections.Connection, cur: Any, files: Sequence[tuple[str, int]],
                        hexed: frozenset[int], commit: bool = True) -> int:
        """The rows' files (each in key order) straight into the table with ``LOAD DATA .. REPLACE`` (in the branch,
        or one fenced transaction, committed here unless ``commit`` is False)."""
        if self.fence is not None:
            self.fence.check(cur, "share")
        written = load_replacing(cur, files, self.table, self.columns, hexed, self.stamped)
        # The write is in flight (not committed or prepared yet) whichever writer fires this first.
        failpoint("during_write")
        if not self.xa and commit:
            conn.commit()
        return written

    def _write_staged(self, conn: pymysql.connections.Connection, cur: Any, staged: int,
                      hexed: frozenset[int], commit: bool = True) -> int:
        """The staged rows into the table with one ``INSERT .. SELECT`` (in the branch, or one fenced transaction,
        committed here unless ``commit`` is False)."""
        if self.fence is not None:
            self.fence.check(cur, "share")
        if DELETE_COLUMN in self.columns:  # tombstones: deleted in the same transaction as the upsert
            cur.execute(delete_tombstones_statement(self.table, self.key_columns))
            cur.execute(upsert_after_tombstones_statement(self.table, self.columns, self.key_columns, self.updates,
                                                          hexed))
        else:
            cur.execute(upsert_from_staging_statement(self.table, self.columns, self.key_columns, self.updates, hexed))
        # The write is in flight (not committed or prepared yet) whichever writer fires this first.
        failpoint("during_write")
        if not self.xa and commit:
            conn.commit()
        return staged

    def _write(self, conn: pymysql.connections.Connection, cur: Any, rows: Iterator[tuple]) -> int:
        """Multi-row statements (the path without bulk load)."""
        if DELETE_COLUMN in self.columns:
            return self._write_with_tombstones(conn, cur, rows)
        full_sql = upsert_statement(self.table, self.columns, self.key_columns, self.updates,
                                    self.rows_per_statement, self.row_alias)
        written = 0
        chunk: list[tuple] = []
        chunk_bytes = 0
        if self.fence is not None:
            self.fence.check(cur, "share")

        def flush(last: bool) -> None:
            nonlocal written, chunk_bytes
            sql = full_sql if len(chunk) == self.rows_per_statement else upsert_statement(
                self.table, self.columns, self.key_columns, self.updates, len(chunk), self.row_alias)
            self._transaction(conn, cur, sql, [v for r in chunk for v in r])
            written += len(chunk)
            chunk.clear()
            chunk_bytes = 0
            if self.fence is not None and not last:
                self.fence.check(cur, "share")  # the next transaction's start

        for row in rows:
            chunk.append(row)
            chunk_bytes += sum(len(v) if isinstance(v, (str, bytes)) else 16 for v in row)
            # Big records make fewer rows per statement: one statement stays far below the server's
            # max_allowed_packet (16 MiB on MariaDB, 64 MiB on MySQL 8) whatever the records' size.
            if len(chunk) == self.rows_per_statement or chunk_bytes >= STATEMENT_MAX_CHARS:
                flush(last=False)
        if chunk:
            flush(last=True)
        return written

    def _transaction(self, conn: pymysql.connections.Connection, cur: Any, statement: str, args: list[Any]) -> None:
        """One statement of the multi-row path, committed on its own (upserts), or added to the branch (XA: after
        a deadlock the whole branch runs again, in ``__call__``, as its earlier statements are gone with it)."""
        def run() -> int:
            cur.execute(statement, args)
            failpoint("during_write")  # in flight: this statement is not committed or prepared yet
            if not self.xa and not self.probe:
                conn.commit()
            return 0

        def restart() -> None:
            conn.rollback()
            if self.fence is not None:
                self.fence.check(cur, "share")  # the new transaction's start

        if self.xa or self.probe:
            run()  # a restart would roll back the statements before this one
        else:
            restarting(run, restart)

    def _write_with_tombstones(self, conn: pymysql.connections.Connection, cur: Any, rows: Iterator[tuple]) -> int:
        """The multi-row path with tombstones: upserts and deletes run in offset order (runs of upserts between
        deletes go through :meth:`_write`), so a replay leaves what the events one after the other leave."""
        delete = self.columns.index(DELETE_COLUMN)
        written = tuple(c for c in self.columns if c != DELETE_COLUMN)
        keys = [written.index(k) for k in self.key_columns]
        upserts = dataclasses.replace(self, columns=written)
        pending: list[tuple] = []
        count = 0
        for row in rows:
            values = row[:delete] + row[delete + 1:]
            if not row[delete]:
                pending.append(values)
                continue
            if pending:
                count += upserts._write(conn, cur, iter(pending))
                pending.clear()
            if self.fence is not None:
                self.fence.check(cur, "share")
            self._transaction(conn, cur, delete_statement(self.table, self.key_columns), [values[i] for i in keys])
            count += 1
        if pending:
            count += upserts._write(conn, cur, iter(pending))
        return count


def _rows(batches: Iterable[pa.RecordBatch], columns: Sequence[str]) -> Iterator[tuple]:
    for batch in batches:
        yield from zip(*(sink_array(batch, name).to_pylist() for name in columns), strict=True)

