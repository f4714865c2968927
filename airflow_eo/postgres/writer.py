"""The partition writer of the PostgreSQL sinks: one Spark task's rows into the table (executor side; picklable,
imports psycopg and pyarrow only, no Airflow).

Every partition is staged first: ``COPY`` of its Arrow rows (CSV that Arrow writes for plain types, no per-value
Python; psycopg's row copy for the others) into a staging table with the target's column types, then one
``INSERT .. SELECT .. ON CONFLICT``. The upsert sink stages into the session's TEMP table and commits the insert
(fenced by the pipeline's epoch when the store is on the same database); the two-phase sink stages into a table
created and dropped inside the task's transaction (a transaction that touched a TEMP table cannot be prepared) and
ends it with ``PREPARE TRANSACTION``.
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv

from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.refused_rows import ROW_LOCK_WAIT_S, refusal_text
from airflow_eo.core.vote import write_while_voting
from airflow_eo.postgres.connection import connect
from airflow_eo.postgres.database import DATABASE
from airflow_eo.postgres.prepared import PreparedTransactions
from airflow_eo.postgres.sql import (
    STAGING_SEQ,
    STAGING_TABLE,
    copy_statement,
    delete_from_staging_statement,
    staging_ddl,
    staging_name,
    upsert_from_staging_statement,
)
from airflow_eo.sqlsink.writer import SqlPartitionWriter, nonempty, rollback_earlier_attempts

#: Bytes of CSV handed to COPY at a time.
COPY_CHUNK_BYTES = 8 * 1024 * 1024
# SQLSTATE classes and codes that refuse a row's values: data exceptions (22: out of range, invalid text for the
# type ..), integrity constraint violations (23: NOT NULL, foreign key, unique, CHECK, exclusion) and a trigger's
# RAISE EXCEPTION (P0001).
REFUSED_VALUE_CLASSES = ("22", "23")
REFUSED_VALUE_CODES = frozenset({"P0001"})
_COPY_COLUMN = re.compile(r"^COPY [^,]+, line \d+, column ([^:]+):", re.MULTILINE)
# Every value quoted, nulls as the bare empty field: PostgreSQL's CSV reads "" as an empty string, nothing as NULL.
_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, quoting_style="all_valid")


def csv_copyable(schema: pa.Schema, columns: Sequence[str]) -> bool:
    """Whether Arrow's CSV text of every column reads back exactly in PostgreSQL (else the row copy)."""
    def plain(t: pa.DataType) -> bool:
        return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_boolean(t)
                or pa.types.is_integer(t) or t in (pa.float32(), pa.float64()) or pa.types.is_timestamp(t)
                or pa.types.is_date32(t) or pa.types.is_decimal128(t))
    return all(plain(schema.field(name).type) for name in columns)


def _array(batch: pa.RecordBatch, name: str) -> pa.Array:
    array = batch.column(batch.schema.get_field_index(name))
    if pa.types.is_timestamp(array.type) and array.type.tz is not None:
        # Spark hands out UTC instants: as naive UTC text a TIMESTAMP column stores UTC and a TIMESTAMPTZ column
        # reads it in the session's zone, UTC (connect() sets it).
        array = array.cast(pa.timestamp(array.type.unit))
    return array


@dataclass(frozen=True, kw_only=True)
class PartitionWriter(SqlPartitionWriter):
    """Writes one Spark partition; runs inside a Spark task (must stay picklable)."""

    two_phase: bool

    def __call__(self, batches: Iterable[pa.RecordBatch], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        found = nonempty(batches)
        if found is None:
            return None, 0  # nothing to write: no transaction at all
        first, stream = found
        csv = csv_copyable(first.schema, self.columns)
        xid = self.xid(partition, stage_id, attempt_id)
        temporary = not self.two_phase
        # The two-phase sink's staging table is a table of the schema while its transaction lasts: named per task,
        # so that concurrent tasks never wait on each other's catalog rows.
        bare = STAGING_TABLE if temporary else f"_eo_stage_{uuid.uuid4().hex[:16]}"
        staging = staging_name(self.table, bare, temporary)
        conn = connect(self.connect_kwargs, autocommit=False)
        try:
            prepared = PreparedTransactions(conn) if self.two_phase else None
            if prepared is not None:
                # Before this task's transaction begins, the connection in autocommit for a moment: ROLLBACK
                # PREPARED may not run inside a transaction (a session of its own for it cost a connection).
                conn.autocommit = True
                rollback_earlier_attempts(prepared, xid)
                conn.autocommit = False
            failpoint("task_write")  # tests: an executor held back while newer attempts commit, or lost
            with conn.cursor() as cur:
                if prepared is not None:
                    # Another task's prepared transaction keeps its locks until the batch commits: never wait on one
                    # without end (a value of a unique index in both tasks' rows: core/refused_rows.py).
                    cur.execute(DATABASE.row_lock_wait(ROW_LOCK_WAIT_S))
                for ddl in staging_ddl(self.table, bare, self.columns, temporary):
                    cur.execute(ddl)
                staged = self._copy(cur, staging, stream, csv)
                if temporary:
                    conn.commit()  # the staged rows are the session's own: nobody sees them
                elif agreed is not None:
                    raise RuntimeError("the two-phase writer holds nothing back: its writes are prepared, not visible")

                def upsert() -> None:
                    if self.fence is not None:
                        self.fence.check(cur, "share")
                    if DELETE_COLUMN in self.columns:  # tombstones: in the same transaction as the upsert
                        cur.execute(delete_from_staging_statement(self.table, staging, self.key_columns))
                    cur.execute(upsert_from_staging_statement(self.table, staging, self.columns, self.key_columns,
                                                              self.updates))
                    if not temporary:
                        cur.execute(f"DROP TABLE {staging}")
                    # The write is in flight (not committed or prepared yet) whichever writer fires this first.
                    failpoint("during_write")

                if agreed is not None:  # held: written uncommitted while the tasks vote, committed if all agree
                    clean, _ = write_while_voting(agreed, upsert)
                    if not clean:
                        conn.rollback()  # another partition found a bad record: nothing of this one is visible
                        return None, 0
                else:
                    upsert()
            if self.probe:  # rolled back: nothing anyone sees, no prepared transaction
                conn.rollback()
                return None, staged
            if prepared is not None:
                prepared.prepare(xid)
                return xid.encode(), staged
            conn.commit()
            return None, staged
        finally:
            conn.close()  # a prepared transaction survives this; an open one is rolled back

    def refusal(self, exc: BaseException) -> str | None:
        state = getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None
        if state is None or not (state.startswith(REFUSED_VALUE_CLASSES) or state in REFUSED_VALUE_CODES):
            return None
        diag = exc.diag  # type: ignore[attr-defined]
        column = diag.column_name
        if column is None:  # COPY names it only in its context: 'COPY <staging>, line 1, column price: "1234.5"'
            found = _COPY_COLUMN.search(diag.context or "")
            column = found.group(1) if found else None
        named = ", ".join(f"{what} {value}" for what, value in (("column", column),
                                                                ("constraint", diag.constraint_name)) if value)
        return refusal_text(f"{diag.message_primary or exc}" + (f" ({named})" if named else "")
                            + f" (SQLSTATE {state})")

    def lock_waited(self, exc: BaseException) -> bool:
        return self.two_phase and not self.probe and isinstance(exc, psycopg.errors.LockNotAvailable)

    def _copy(self, cur: Any, staging: str, batches: Iterator[pa.RecordBatch], csv: bool) -> int:
        staged = 0
        with cur.copy(copy_statement(staging, (*self.columns, STAGING_SEQ), csv)) as copy:
            buffer = io.BytesIO()
            for batch in batches:
                # The load order, numbered here (STAGING_SEQ says why not by the server).
                order = pa.array(range(staged, staged + batch.num_rows), pa.int64())
                arrays = [*(_array(batch, name) for name in self.columns), order]
                staged += batch.num_rows
                if csv:
                    rows = pa.RecordBatch.from_arrays(arrays, [f"c{i}" for i in range(len(arrays))])
                    pa_csv.write_csv(rows, buffer, write_options=_CSV_OPTIONS)
                    if buffer.tell() >= COPY_CHUNK_BYTES:
                        copy.write(buffer.getvalue())
                        buffer = io.BytesIO()
                else:
                    for row in zip(*(a.to_pylist() for a in arrays), strict=True):
                        copy.write_row(row)
            if buffer.tell():
                copy.write(buffer.getvalue())
        return staged

