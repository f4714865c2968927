"""Bulk load (executor side): a Spark task's Arrow rows as CSV files (written by Arrow, no per-value Python), loaded
with ``LOAD DATA LOCAL INFILE`` into a session-private staging table; the writer then moves them into the table with
one ``INSERT .. SELECT``."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pymysql

from airflow_eo.core.task_files import task_folder
from airflow_eo.mysql.connection import loading_local_file
from airflow_eo.mysql.sql import load_replacing_statement, load_staging_statement, staging_table_ddl


def sink_array(batch: pa.RecordBatch, name: str) -> pa.Array:
    array = batch.column(batch.schema.get_field_index(name))
    if pa.types.is_timestamp(array.type) and array.type.tz is not None:
        # Spark hands out UTC instants; DATETIME columns take naive UTC values.
        array = array.cast(pa.timestamp(array.type.unit))
    return array


#: A staging file is loaded when it holds this many bytes of Arrow data (disk use per writer task stays bounded).
STAGING_FILE_BYTES = 64 * 1024 * 1024
_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, null_string="NULL", quoting_style="needed")


#: The staging type of binary columns: staged as hexadecimal text (any byte survives CSV), ``UNHEX``-ed into the table.
HEX_STAGED = "LONGTEXT CHARACTER SET ascii"
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", np.uint8)


def _staging_type(arrow_type: pa.DataType) -> str | None:
    """The staging column's type for an Arrow type whose CSV text MariaDB/MySQL reads back exactly; None for types
    that go through the multi-row statements instead (nested, time, half floats)."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "LONGTEXT"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return HEX_STAGED
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


def staging_types(schema: pa.Schema, columns: Sequence[str]) -> list[str] | None:
    types = [_staging_type(schema.field(name).type) for name in columns]
    return None if None in types else [t for t in types if t is not None]


def hex_columns(types: Sequence[str]) -> frozenset[int]:
    """The positions of the staged columns that hold hexadecimal text of binary values."""
    return frozenset(i for i, sql_type in enumerate(types) if sql_type == HEX_STAGED)


def _hex(array: pa.Array) -> pa.Array:
    """A binary array as upper-case hexadecimal text (vectorised: no per-value Python); NULL stays NULL."""
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    n = len(array)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], offset_type)[array.offset:array.offset + n + 1].astype(np.int64)
    data = (np.frombuffer(buffers[2], np.uint8)[offsets[0]:offsets[-1]] if buffers[2] is not None and n
            else np.empty(0, np.uint8))
    text = np.empty(2 * len(data), np.uint8)
    text[0::2], text[1::2] = _HEX_DIGITS[data >> 4], _HEX_DIGITS[data & 15]
    validity = pc.is_valid(array).buffers()[1] if array.null_count else None
    return pa.Array.from_buffers(pa.large_string(), n, [validity, pa.py_buffer((offsets - offsets[0]) * 2),
                                                        pa.py_buffer(text)], null_count=array.null_count)


def _csv_rows(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.RecordBatch:
    """The columns as their CSV text should read: booleans as 1/0, binary values as hexadecimal text."""
    arrays = [sink_array(batch, name) for name in columns]
    arrays = [a.cast(pa.int8()) if pa.types.is_boolean(a.type) else a for a in arrays]  # "true" -> 1
    arrays = [_hex(a) if pa.types.is_binary(a.type) or pa.types.is_large_binary(a.type) else a for a in arrays]
    return pa.RecordBatch.from_arrays(arrays, [f"c{i}" for i in range(len(arrays))])


def csv_files(batches: Iterable[pa.RecordBatch], columns: Sequence[str],
              sort_by: Sequence[str] = ()) -> Iterator[tuple[str, int]]:
    """The rows as CSV files that Arrow writes (no per-value Python), each of at most :data:`STAGING_FILE_BYTES` of
    Arrow data: yields (path, rows); a file is removed when the next one is asked for (or the generator closes).
    ``sort_by``: each file's rows in the order of these columns, stably (the rows of one key stay in load order), so
    that an index is written in key order, not at random; such a file's rows are held in memory until written."""
    fd, path = tempfile.mkstemp(prefix="airflow_eo_stage_", suffix=".csv", dir=task_folder())
    os.close(fd)
    writer: pa_csv.CSVWriter | None = None
    held: list[pa.RecordBatch] = []
    rows = size = 0
    try:
        for batch in itertools.chain(batches, [None]):  # None: the end, which writes the last file
            if batch is not None:
                rows, size = rows + batch.num_rows, size + batch.nbytes
                if sort_by:
                    held.append(batch)
                else:
                    out = _csv_rows(batch, columns)
                    writer = writer or pa_csv.CSVWriter(path, out.schema, write_options=_CSV_OPTIONS)
                    writer.write_batch(out)
            if rows and (batch is None or size >= STAGING_FILE_BYTES):
                if held:
                    chunk = pa.concat_batches(held)
                    chunk = chunk.take(pc.sort_indices(chunk, [(name, "ascending") for name in sort_by]))
                    out = _csv_rows(chunk, columns)
                    writer = pa_csv.CSVWriter(path, out.schema, write_options=_CSV_OPTIONS)
                    writer.write_batch(out)
                    held = []
                assert writer is not None
                writer.close()
                writer = None
                yield path, rows
                rows = size = 0
    finally:
        if writer is not None:
            writer.close()
        with contextlib.suppress(FileNotFoundError):  # the last file was kept (:func:`kept_csv_files`)
            os.unlink(path)


@contextlib.contextmanager
def kept_csv_files(batches: Iterable[pa.RecordBatch], columns: Sequence[str],
                   sort_by: Sequence[str] = ()) -> Iterator[list[tuple[str, int]]]:
    """All of :func:`csv_files` at once, kept until the block ends: a transaction that loads them can load them
    again after a deadlock (they take the disk the staging path takes on the server)."""
    kept: list[tuple[str, int]] = []
    try:
        for path, rows in csv_files(batches, columns, sort_by):
            os.replace(path, f"{path}.{len(kept)}")
            kept.append((f"{path}.{len(kept)}", rows))
        yield kept
    finally:
        for path, _ in kept:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def stage(cur: Any, batches: Iterable[pa.RecordBatch], columns: Sequence[str], types: Sequence[str]) -> int:
    """Loads the partition's rows into the session's staging table with ``LOAD DATA LOCAL INFILE`` of
    :func:`csv_files`; returns the rows."""
    cur.execute(staging_table_ddl(types))
    statement = load_staging_statement(len(columns))
    return sum(_load(cur, statement, path, rows) for path, rows in csv_files(batches, columns))


def load_replacing(cur: Any, files: Iterable[tuple[str, int]], table: str, columns: Sequence[str],
                   hex_positions: frozenset[int], stamped: Sequence[str] = ()) -> int:
    """Loads :func:`csv_files` straight into ``table`` with ``LOAD DATA LOCAL INFILE .. REPLACE`` (where that equals
    the upsert: :func:`~.table_shape.why_replace_is_not_upsert`), in the caller's transaction; returns the
    rows. A warning fails it: the caller's transaction (or XA branch) is then never committed."""
    statement = load_replacing_statement(table, columns, hex_positions, stamped)
    # A value rounded to the column's scale is a note, as in the staging path's INSERT .. SELECT: not recorded, so
    # that the warnings left are the ones that fail the load.
    cur.execute("SET SESSION sql_notes = 0")
    return sum(_load(cur, statement, path, rows, into=table) for path, rows in files)


_RECORDS = re.compile(rb"Records: (\d+)")


def _load(cur: Any, statement: str, path: str, rows: int, into: str | None = None) -> int:
    # LOCAL turns data errors into warnings: any warning (or a row count off) fails the task, nothing is guessed.
    advice = "; nothing of this task was written. Set bulk_load=False on the sink to write with statements."
    target = f"table {into}" if into is not None else "the staging table"
    try:
        with loading_local_file(cur.connection, path):
            loaded = cur.execute(statement, (path,))
    except pymysql.err.DataError as exc:  # strict mode: a value the table's column cannot take (MariaDB)
        raise pymysql.err.DataError(f"bulk load of {rows} row(s) into {target} failed: {exc.args[-1]}{advice}") from exc
    if into is not None:
        # REPLACE counts a replaced row twice in the affected rows: the server's "Records: N" counts the file's rows.
        # pymysql keeps that message on the result only (MySQLdb's Connection.info()).
        match = _RECORDS.search(getattr(cur.connection._result, "message", None) or b"")
        loaded = int(match[1]) if match else loaded
    cur.execute("SHOW WARNINGS LIMIT 3")
    warnings = cur.fetchall()
    if warnings or loaded != rows:
        raise pymysql.err.DataError(
            f"bulk load of {rows} row(s) into {target} loaded {loaded}"
            + (f", with warnings: {'; '.join(str(w[2]) for w in warnings)}" if warnings else "") + advice)
    return loaded
