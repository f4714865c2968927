"""Bulk load (executor side): a Spark task's Arrow rows as CSV files (written by Arrow, no per-value Python), loaded
with ``LOAD DATA LOCAL INFILE`` into a session-private staging table; the writer then moves them into the table with
one ``INSERT .. SELECT``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pymysql

from airflow_eo.mysql.connection import loading_local_file
from airflow_eo.mysql.sql import load_staging_statement, staging_table_ddl


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


def stage(cur: Any, batches: Iterable[pa.RecordBatch], columns: Sequence[str], types: Sequence[str]) -> int:
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
            arrays = [sink_array(batch, name) for name in columns]
            arrays = [a.cast(pa.int8()) if pa.types.is_boolean(a.type) else a for a in arrays]  # "true" -> 1
            arrays = [_hex(a) if pa.types.is_binary(a.type) or pa.types.is_large_binary(a.type) else a
                      for a in arrays]
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
    with loading_local_file(cur.connection, path):
        loaded = cur.execute(statement, (path,))
    cur.execute("SHOW WARNINGS LIMIT 3")
    warnings = cur.fetchall()
    if warnings or loaded != rows:
        raise pymysql.err.DataError(
            f"bulk load of {rows} row(s) into the staging table loaded {loaded}"
            + (f", with warnings: {'; '.join(str(w[2]) for w in warnings)}" if warnings else "")
            + "; nothing of this task was written. Set bulk_load=False on the sink to write with statements.")
    return loaded
