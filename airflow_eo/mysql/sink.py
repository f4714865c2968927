"""MySQL / MariaDB sinks (``docs/architecture.md``, "Sinks"): idempotent upsert, and XA two-phase commit.

Driver side: :class:`MySqlUpsertAdapter` / :class:`MySqlXaAdapter` (the run-time side of
:class:`~airflow_eo.sinks.MySqlUpsertSink` / :class:`~airflow_eo.sinks.MySqlXaSink`) check
the target, recover and finalize XA branches. Executor side: :class:`PartitionWriter` is a
picklable callable that writes one Spark partition's Arrow batches with multi-row
statements; in XA mode the whole partition is one branch, prepared and reported.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pymysql

from airflow_eo.core.config import UpdateMode
from airflow_eo.core.errors import ConfigurationError, UnsupportedServerError
from airflow_eo.core.faults import HOLD_WRITE, crash_if, hold_if, kill_executor_if_requested
from airflow_eo.core.identifiers import quote_table
from airflow_eo.core.protocol import BatchContext, BatchRecord, DeadLetter, PartitionRunner, WriteResult
from airflow_eo.core.recovery import BranchAction, decide_branch
from airflow_eo.core.xid import Xid, parse_recover_row, pipeline_key
from airflow_eo.mysql import connection as mysql_connection
from airflow_eo.mysql.sql import (
    DEAD_LETTER_COLUMNS,
    dead_letter_ddl,
    keeps_prepared_xa,
    load_staging_statement,
    parse_server_version,
    staging_table_ddl,
    supports_row_alias,
    upsert_from_staging_statement,
    upsert_statement,
)
from airflow_eo.mysql.store import EpochFence

if TYPE_CHECKING:
    from airflow_eo.sinks import MySqlUpsertSink

log = logging.getLogger(__name__)

ER_XAER_NOTA = 1397  # unknown xid: already committed / rolled back
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_NO_SUCH_TABLE = 1146
# Characters of values per multi-row statement (at most 4 bytes each in utf8mb4: 8 MiB).
STATEMENT_MAX_CHARS = 2 * 1024 * 1024
#: Dead letters per Arrow batch handed to their writer (the driver holds about this many at a time).
DEAD_LETTER_CHUNK = 10_000


def connect(connect_kwargs: Mapping[str, Any], autocommit: bool = True,
            local_infile: bool = False) -> pymysql.connections.Connection:
    return mysql_connection.connect(connect_kwargs, autocommit=autocommit, charset="utf8mb4",
                                    local_infile=local_infile)


# --------------------------------------------------------------------------- XA helpers


def xa_recover(conn: pymysql.connections.Connection) -> list[Xid]:
    """Prepared branches that are ours (our formatID), of any pipeline."""
    with conn.cursor() as cur:
        cur.execute("XA RECOVER")
        rows = cur.fetchall()
    return [x for x in (parse_recover_row(*row[:4]) for row in rows) if x is not None]


def prepared_branches(connect_kwargs: Mapping[str, Any], pipeline_id: str) -> list[Xid]:
    """The pipeline's prepared (in-doubt) branches on a server, sorted; read-only.

    :param connect_kwargs: pymysql arguments of the sink's database.
    :param pipeline_id: the pipeline.
    """
    conn = connect(connect_kwargs)
    try:
        return sorted(x for x in xa_recover(conn) if x.pipeline_key == pipeline_key(pipeline_id))
    finally:
        conn.close()


def read_dead_letters(connect_kwargs: Mapping[str, Any], table: str, pipeline_id: str, batch_id: int | None,
                      limit: int) -> list[dict[str, Any]] | None:
    """The pipeline's dead letters (oldest offsets first); None when the table does not exist.

    :param connect_kwargs: pymysql arguments of the sink's database.
    :param table: the dead-letter table (``table`` or ``database.table``).
    :param pipeline_id: the pipeline.
    :param batch_id: only this batch's.
    :param limit: at most this many.
    """
    where, args = "pipeline_id = %s", list[Any]([pipeline_id])
    if batch_id is not None:
        where += " AND batch_id = %s"
        args.append(batch_id)
    conn = mysql_connection.connect(connect_kwargs, autocommit=True, charset="utf8mb4",
                                    cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")  # created_at (TIMESTAMP) in UTC
            try:
                cur.execute(f"SELECT batch_id, topic, kafka_partition, kafka_offset, record_key, raw_value, error, "
                            f"created_at FROM {quote_table(table)} WHERE {where} "
                            "ORDER BY batch_id, topic, kafka_partition, kafka_offset LIMIT %s", (*args, limit))
            except pymysql.err.ProgrammingError as exc:
                if exc.args and exc.args[0] == ER_NO_SUCH_TABLE:
                    return None
                raise
            return list(cur.fetchall())
    finally:
        conn.close()


def xa_end_of(conn: pymysql.connections.Connection, xid: Xid, verb: str) -> bool:
    """``XA COMMIT|ROLLBACK xid``; False when the server no longer knows it (done before)."""
    try:
        with conn.cursor() as cur:
            cur.execute(f"XA {verb} {xid.sql()}")
        return True
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] == ER_XAER_NOTA:
            return False
        raise


# --------------------------------------------------------------------------- executor side


@dataclass(frozen=True)
class PartitionWriter:
    """Writes one Spark partition; runs inside a Spark task (must stay picklable)."""

    connect_kwargs: Mapping[str, Any]
    table: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    updates: Mapping[str, str]
    row_alias: bool
    rows_per_statement: int
    xa: bool
    pipeline_key: str
    batch_id: int
    epoch: int
    driver_pid: int
    #: upsert sink on the offset store's server: each transaction first checks the attempt's epoch
    fence: EpochFence | None = None
    #: LOAD DATA LOCAL INFILE into a staging table + one INSERT .. SELECT, for columns of types it reads back exactly
    bulk_load: bool = False

    def __call__(self, batches: Iterable[pa.RecordBatch], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        nonempty = (b for b in batches if b.num_rows)
        first = next(nonempty, None)
        if first is None:
            return None, 0  # nothing to write: no branch at all
        stream = _chain(first, nonempty)
        staging_types = _staging_types(first.schema, self.columns) if self.bulk_load else None
        if agreed is not None and staging_types is None:
            raise RuntimeError("a writer without bulk load cannot hold its rows (can_hold_writes said no)")
        # XA: one branch; fenced upsert: explicit transactions (the epoch's shared lock lasts until commit).
        autocommit = not self.xa and self.fence is None
        conn = connect(self.connect_kwargs, autocommit=autocommit, local_infile=staging_types is not None)
        try:
            xid = Xid(self.pipeline_key, self.batch_id, self.epoch, partition, stage_id, attempt_id)
            if self.xa:
                self._rollback_earlier_attempts(conn, xid)
            with conn.cursor() as cur:
                hold_if(HOLD_WRITE)  # test faults: an executor held back while newer attempts commit ...
                kill_executor_if_requested()  # ... or lost mid-write
                staged = 0
                if staging_types is not None:
                    # Before XA START: session-private rows that belong to no branch and no transaction.
                    staged = _stage(cur, stream, self.columns, staging_types)
                    if not autocommit:
                        conn.commit()
                    if agreed is not None and not agreed():
                        return None, 0  # another partition found a bad record: write nothing
                if self.xa:
                    cur.execute(f"XA START {xid.sql()}")
                written = (self._write_staged(conn, cur, staged) if staging_types is not None
                           else self._write(conn, cur, _rows(stream, self.columns)))
                if self.xa:
                    cur.execute(f"XA END {xid.sql()}")
                    cur.execute(f"XA PREPARE {xid.sql()}")
                    return xid.encode(), written
            return None, written
        finally:
            conn.close()  # a prepared branch survives this (checked: keeps_prepared_xa)

    def _rollback_earlier_attempts(self, conn: pymysql.connections.Connection, xid: Xid) -> None:
        # An earlier attempt of this task may have prepared its branch and then died: that
        # branch holds row locks this attempt would wait on until the lock wait timeout.
        for other in xa_recover(conn):
            if (other.pipeline_key, other.batch_id, other.epoch, other.partition) == (
                    xid.pipeline_key, xid.batch_id, xid.epoch, xid.partition) and other != xid:
                xa_end_of(conn, other, "ROLLBACK")

    def _write_staged(self, conn: pymysql.connections.Connection, cur: Any, staged: int) -> int:
        """The staged rows into the table with one ``INSERT .. SELECT`` (in the branch, or one fenced transaction)."""
        if self.fence is not None:
            self.fence.check(cur, "LOCK IN SHARE MODE")
        cur.execute(upsert_from_staging_statement(self.table, self.columns, self.key_columns, self.updates))
        if not self.xa:
            conn.commit()
        crash_if("during_write", self.driver_pid)
        return staged

    def _write(self, conn: pymysql.connections.Connection, cur: Any, rows: Iterator[tuple]) -> int:
        """Multi-row statements (the path without bulk load)."""
        full_sql = upsert_statement(self.table, self.columns, self.key_columns, self.updates,
                                    self.rows_per_statement, self.row_alias)
        written = 0
        chunk: list[tuple] = []
        chunk_bytes = 0
        if self.fence is not None:
            self.fence.check(cur, "LOCK IN SHARE MODE")

        def flush(last: bool) -> None:
            nonlocal written, chunk_bytes
            sql = full_sql if len(chunk) == self.rows_per_statement else upsert_statement(
                self.table, self.columns, self.key_columns, self.updates, len(chunk), self.row_alias)
            cur.execute(sql, [v for r in chunk for v in r])
            written += len(chunk)
            chunk.clear()
            chunk_bytes = 0
            if not self.xa:
                conn.commit()
            crash_if("during_write", self.driver_pid)
            if self.fence is not None and not last:
                self.fence.check(cur, "LOCK IN SHARE MODE")  # the next transaction's start

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


def _sink_array(batch: pa.RecordBatch, name: str) -> pa.Array:
    array = batch.column(batch.schema.get_field_index(name))
    if pa.types.is_timestamp(array.type) and array.type.tz is not None:
        # Spark hands out UTC instants; DATETIME columns take naive UTC values.
        array = array.cast(pa.timestamp(array.type.unit))
    return array


def _rows(batches: Iterable[pa.RecordBatch], columns: Sequence[str]) -> Iterator[tuple]:
    for batch in batches:
        yield from zip(*(_sink_array(batch, name).to_pylist() for name in columns), strict=True)


# --------------------------------------------------------------------------- bulk load (executor side)

#: A staging file is loaded when it holds this many bytes of Arrow data (disk use per writer task stays bounded).
STAGING_FILE_BYTES = 64 * 1024 * 1024
_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, null_string="NULL", quoting_style="needed")


def _staging_type(arrow_type: pa.DataType) -> str | None:
    """The staging column's type for an Arrow type whose CSV text MariaDB/MySQL reads back exactly; None for types
    that go through the multi-row statements instead (binary, nested, time, half floats)."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "LONGTEXT"
    if pa.types.is_boolean(arrow_type) or pa.types.is_signed_integer(arrow_type) or arrow_type in (
            pa.uint8(), pa.uint16(), pa.uint32()):
        return "BIGINT"
    if arrow_type == pa.uint64():
        return "BIGINT UNSIGNED"
    if arrow_type == pa.float32():
        return "FLOAT"  # Arrow writes a float32's shortest text: a DOUBLE would read 0.1, not float32(0.1)
    if arrow_type == pa.float64():
        return "DOUBLE"
    if pa.types.is_timestamp(arrow_type):
        return "DATETIME(6)"
    if pa.types.is_date32(arrow_type):
        return "DATE"
    if pa.types.is_decimal128(arrow_type) and arrow_type.precision <= 65 and arrow_type.scale <= 30:
        return f"DECIMAL({arrow_type.precision},{arrow_type.scale})"
    return None


def _staging_types(schema: pa.Schema, columns: Sequence[str]) -> list[str] | None:
    types = [_staging_type(schema.field(name).type) for name in columns]
    return None if None in types else [t for t in types if t is not None]


def _stage(cur: Any, batches: Iterable[pa.RecordBatch], columns: Sequence[str], types: Sequence[str]) -> int:
    """Loads the partition's rows into the session's staging table with ``LOAD DATA LOCAL INFILE``, from CSV files
    that Arrow writes (no per-value Python), at most :data:`STAGING_FILE_BYTES` at a time; returns the rows."""
    cur.execute(staging_table_ddl(types))
    statement = load_staging_statement(len(columns))
    fd, path = tempfile.mkstemp(prefix="airflow_eo_stage_", suffix=".csv")
    os.close(fd)
    staged = pending_rows = pending_bytes = 0
    writer: pa_csv.CSVWriter | None = None
    try:
        for batch in batches:
            arrays = [_sink_array(batch, name) for name in columns]
            arrays = [a.cast(pa.int8()) if pa.types.is_boolean(a.type) else a for a in arrays]  # "true" -> 1
            rows = pa.RecordBatch.from_arrays(arrays, [f"c{i}" for i in range(len(arrays))])
            if writer is None:
                writer = pa_csv.CSVWriter(path, rows.schema, write_options=_CSV_OPTIONS)
            writer.write_batch(rows)
            pending_rows += rows.num_rows
            pending_bytes += rows.nbytes
            if pending_bytes >= STAGING_FILE_BYTES:
                writer.close()
                writer = None
                staged += _load(cur, statement, path, pending_rows)
                pending_rows = pending_bytes = 0
        if writer is not None:
            writer.close()
            staged += _load(cur, statement, path, pending_rows)
    finally:
        if writer is not None:
            writer.close()
        os.unlink(path)
    return staged


def _load(cur: Any, statement: str, path: str, rows: int) -> int:
    # LOCAL turns data errors into warnings: any warning (or a row count off) fails the task, nothing is guessed.
    loaded = cur.execute(statement, (path,))
    cur.execute("SHOW WARNINGS LIMIT 3")
    warnings = cur.fetchall()
    if warnings or loaded != rows:
        raise pymysql.err.DataError(
            f"bulk load of {rows} row(s) into the staging table loaded {loaded}"
            + (f", with warnings: {'; '.join(str(w[2]) for w in warnings)}" if warnings else "")
            + "; nothing of this task was written. Set bulk_load=False on the sink to write with statements.")
    return loaded


def _chain(first: tuple, rest: Iterator[tuple]) -> Iterator[tuple]:
    yield first
    yield from rest


# --------------------------------------------------------------------------- driver side


class MySqlUpsertAdapter:
    """Idempotent upsert: each Spark task commits its own statements; replays rewrite the same rows.

    Writes are visible at once, so a late write of an older attempt (an executor that outlived its
    SIGKILLed driver) could overwrite a newer row of the same key. When the offset store lives on
    the same server (same host and port), every write transaction first reads the pipeline's epoch
    with a shared lock (:class:`~airflow_eo.mysql.store.EpochFence`): a newer attempt's
    take waits for the writes in flight, and the older attempt's later writes abort. On another
    server there is no such fence: stop a dead attempt's Spark application before re-running it.

    :param spec: the validated sink spec (table, key columns, updates, statement size).
    :param connect_kwargs: pymysql arguments from the spec's Airflow ``mysql`` connection.
    :param store_kwargs: pymysql arguments of the offset store's connection (None: not fenced).
    """

    owns_commit_point = False
    writes_visible_before_commit = True  # replay-safe upserts, committed as they go
    xa = False  # one XA branch per Spark task, prepared, committed after the commit point

    def __init__(self, spec: MySqlUpsertSink, connect_kwargs: Mapping[str, Any],
                 store_kwargs: Mapping[str, Any] | None = None) -> None:
        self.spec, self.connect_kwargs = spec, dict(connect_kwargs)
        self.name = spec.name
        self.store_kwargs = dict(store_kwargs) if store_kwargs else None
        self.row_alias = False
        self.bulk_load = False  # the spec asks for it and the server allows LOAD DATA LOCAL (checked in check())
        self.table_columns: list[str] = []

    # -- checks before any side effect

    def check(self) -> None:
        kwargs = self.connect_kwargs
        try:
            conn = connect(kwargs)
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
                self.bulk_load = bool(self.spec.bulk_load and allowed and int(allowed[0]))
                if self.spec.bulk_load and not self.bulk_load:
                    log.info("%s: the server does not allow LOAD DATA LOCAL INFILE (local_infile=OFF); writing with "
                             "multi-row statements", self.name)
                self.table_columns = self._table_columns(cur)
                self._check_unique_key(cur)
                cur.execute(dead_letter_ddl(self.spec.dead_letter_table))
        finally:
            conn.close()

    def _check_server(self, conn: pymysql.connections.Connection, flavor: str, version: tuple[int, int, int]) -> None:
        """Hook for the XA sink's stricter requirements."""

    def _split_table(self) -> tuple[str | None, str]:
        parts = self.spec.table.split(".")
        return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])

    def _table_columns(self, cur: Any) -> list[str]:
        schema, table = self._split_table()
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) "
            "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (schema, table),
        )
        columns = [row[0] for row in cur.fetchall()]
        if not columns:
            raise ConfigurationError(
                f"{self.name}: table {self.spec.table!r} does not exist in database "
                f"{schema or self.connect_kwargs.get('database')!r}: create it first"
            )
        missing = [k for k in self.spec.key_columns if k not in columns]
        if missing:
            raise ConfigurationError(f"{self.name}: table {self.spec.table!r} has no key column(s) "
                                     f"{', '.join(missing)}; its columns are {', '.join(columns)}")
        return columns

    def _check_unique_key(self, cur: Any) -> None:
        schema, table = self._split_table()
        cur.execute(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE "
            "TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s AND NON_UNIQUE = 0", (schema, table),
        )
        indexes: dict[str, set[str]] = {}
        for index, column in cur.fetchall():
            indexes.setdefault(index, set()).add(column)
        if set(self.spec.key_columns) not in indexes.values():
            raise ConfigurationError(
                f"{self.name}: table {self.spec.table!r} needs a PRIMARY KEY or UNIQUE index on exactly "
                f"({', '.join(self.spec.key_columns)}) so that a replayed row overwrites instead of "
                "duplicating; add one"
            )

    def check_columns(self, columns: Sequence[str]) -> None:
        unknown = [c for c in columns if c not in self.table_columns]
        if unknown:
            raise ConfigurationError(
                f"{self.name}: the transform's output has column(s) {', '.join(unknown)} that table "
                f"{self.spec.table!r} lacks; its columns are {', '.join(self.table_columns)}"
            )
        missing_keys = [k for k in self.spec.key_columns if k not in columns]
        if missing_keys:
            raise ConfigurationError(f"{self.name}: the transform's output lacks key column(s) "
                                     f"{', '.join(missing_keys)}")

    # -- writes

    def write(self, out: Any, batch: BatchContext, runner: PartitionRunner) -> WriteResult:
        """Every Spark task writes its partition (one XA branch each in XA mode)."""
        return runner.run_partitions(out, self.partition_writer(batch, out.columns))

    def can_hold_writes(self, out: Any) -> bool:
        """Yes when the bulk load takes every output column: a partition is staged before anything is written."""
        if not self.bulk_load:
            return False
        from pyspark.sql.pandas.types import to_arrow_schema

        return _staging_types(to_arrow_schema(out.schema), out.columns) is not None

    def epoch_fence(self, batch: BatchContext) -> EpochFence | None:
        """The fence of this attempt's writes, checked once here on the driver (which also tells a sink
        user that may not read the store's table what to grant, before anything is written)."""
        store = self.store_kwargs
        if self.xa or store is None or (store.get("host"), store.get("port")) != (
                self.connect_kwargs.get("host"), self.connect_kwargs.get("port")):
            return None
        fence = EpochFence(batch.pipeline_id, batch.epoch, batch.interval, store.get("database"))
        conn = connect(self.connect_kwargs)
        try:
            with conn.cursor() as cur:
                fence.check(cur, "")
        except pymysql.err.MySQLError as exc:
            raise ConfigurationError(
                f"{self.name}: the sink's user {self.connect_kwargs.get('user')!r} cannot read the offset store's "
                f"epoch ({exc.args[-1]}); writes of an upsert sink on the store's server are fenced by it: "
                f"GRANT SELECT ON {store.get('database')}.eo_pipeline and .eo_interval to that user"
            ) from exc
        finally:
            conn.close()
        return fence

    def partition_writer(self, batch: BatchContext, columns: Sequence[str]) -> PartitionWriter:
        self.check_columns(columns)
        spec = self.spec
        # The spec's __post_init__ made every update mode an UpdateMode: UpdateMode(m) only narrows the type.
        return PartitionWriter(
            connect_kwargs=self.connect_kwargs, table=spec.table, columns=tuple(columns),
            key_columns=tuple(spec.key_columns), updates={c: UpdateMode(m).value for c, m in spec.updates.items()},
            row_alias=self.row_alias, rows_per_statement=spec.rows_per_statement, xa=self.xa,
            pipeline_key=pipeline_key(batch.pipeline_id), batch_id=batch.batch_id, epoch=batch.epoch,
            driver_pid=os.getpid(),  # the during_write crash point kills the driver, not the executor
            fence=self.epoch_fence(batch), bulk_load=self.bulk_load,
        )

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        """Dead letters, keyed by (pipeline, topic, partition, offset): a replay rewrites the same rows. Streamed in
        chunks of :data:`DEAD_LETTER_CHUNK` into one writer (one XA branch)."""
        first = next(records, None)
        if first is None:
            return []
        records = itertools.chain([first], records)
        writer = PartitionWriter(
            connect_kwargs=self.connect_kwargs, table=self.spec.dead_letter_table, columns=DEAD_LETTER_COLUMNS,
            key_columns=("pipeline_id", "topic", "kafka_partition", "kafka_offset"), updates={},
            row_alias=self.row_alias, rows_per_statement=self.spec.rows_per_statement, xa=self.xa,
            pipeline_key=pipeline_key(batch.pipeline_id), batch_id=batch.batch_id, epoch=batch.epoch, driver_pid=0,
            fence=self.epoch_fence(batch),
        )

        def chunks() -> Iterator[pa.RecordBatch]:
            while chunk := list(itertools.islice(records, DEAD_LETTER_CHUNK)):
                yield pa.RecordBatch.from_pylist([{**dataclasses.asdict(r), "pipeline_id": batch.pipeline_id,
                                                   "batch_id": batch.batch_id} for r in chunk])

        xid, _ = writer(chunks(), partition=-1, stage_id=0, attempt_id=0)
        return [xid] if xid else []

    # -- protocol steps (nothing to do: every write is already visible and replay-safe)

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> set[int]:
        return set()

    def commit(self, batch: BatchRecord) -> None:
        return None

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        return None

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        return None


class MySqlXaAdapter(MySqlUpsertAdapter):
    """XA: one branch per Spark task, prepared, committed only after the store's commit point."""

    xa = True
    writes_visible_before_commit = False  # prepared branches: nothing visible before finalize

    def _check_server(self, conn: pymysql.connections.Connection, flavor: str, version: tuple[int, int, int]) -> None:
        if not keeps_prepared_xa(flavor, version):
            raise UnsupportedServerError(
                f"{self.name}: {flavor} {'.'.join(map(str, version))} rolls back prepared XA branches when a "
                "connection closes, which breaks exactly-once; use MariaDB >= 10.5 or MySQL >= 5.7.7 "
                "(8.x recommended), or MySqlUpsertSink"
            )
        try:
            xa_recover(conn)
        except pymysql.err.MySQLError as exc:
            if exc.args and exc.args[0] == ER_SPECIFIC_ACCESS_DENIED:
                raise UnsupportedServerError(
                    f"{self.name}: user {self.connect_kwargs.get('user')!r} may not run XA RECOVER; "
                    "on MySQL 8 run: GRANT XA_RECOVER_ADMIN ON *.* TO '<user>'@'<host>'"
                ) from exc
            raise

    def prepared_branches(self, pipeline_id: str) -> list[Xid]:
        """The pipeline's in-doubt branches on the sink's server (read-only)."""
        return prepared_branches(self.connect_kwargs, pipeline_id)

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> set[int]:
        """Resolve every prepared branch of this pipeline: commit if its batch committed and lists it, else roll
        back (:func:`~airflow_eo.core.recovery.decide_branch`)."""
        key = pipeline_key(pipeline_id)
        conn = connect(self.connect_kwargs)
        try:
            ours = [x for x in xa_recover(conn) if x.pipeline_key == key]
            if not ours:
                return set()
            log.warning("%s: %d prepared XA branch(es) of pipeline %s left by earlier attempts; resolving",
                        self.name, len(ours), pipeline_id)
            records: dict[int, BatchRecord | None] = {}
            for xid in sorted(ours):
                if xid.batch_id not in records:
                    records[xid.batch_id] = batch_lookup(xid.batch_id)
                decision = decide_branch(xid, records[xid.batch_id])
                xa_end_of(conn, xid, "COMMIT" if decision.action is BranchAction.COMMIT else "ROLLBACK")
                log.info("recovered branch %s of batch %d: %s (%s)", xid.encode(), xid.batch_id,
                         decision.action.value, decision.reason)
            return set()  # the store's commit is the commit point: nothing to roll forward
        finally:
            conn.close()

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        conn = connect(self.connect_kwargs)
        try:
            for i, text in enumerate(xids):
                xa_end_of(conn, Xid.decode(text), "COMMIT")
                if i == 0 and len(xids) > 1:
                    crash_if("between_xa_commits")
            # Strays: branches of this batch that failed attempts prepared but nobody reported.
            key, reported = pipeline_key(batch.pipeline_id), set(xids)
            for xid in xa_recover(conn):
                if xid.pipeline_key == key and xid.batch_id == batch.batch_id and xid.encode() not in reported:
                    xa_end_of(conn, xid, "ROLLBACK")
        finally:
            conn.close()

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        """Roll back this attempt's branches of the batch: the reported ones, and those its Spark tasks
        prepared before the job failed (same batch and epoch: no other attempt's branch matches)."""
        try:
            conn = connect(self.connect_kwargs)
        except pymysql.err.MySQLError:
            return  # the next attempt's recovery rolls them back
        try:
            key = pipeline_key(batch.pipeline_id)
            ours = {Xid.decode(text) for text in xids}
            ours.update(x for x in xa_recover(conn)
                        if (x.pipeline_key, x.batch_id, x.epoch) == (key, batch.batch_id, batch.epoch))
            for xid in sorted(ours):
                try:
                    xa_end_of(conn, xid, "ROLLBACK")
                except pymysql.err.MySQLError:
                    pass
        except pymysql.err.MySQLError:
            pass  # best effort: the next attempt's recovery rolls them back
        finally:
            conn.close()
