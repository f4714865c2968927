"""Protobuf values decoded in Python on the executors, in Arrow batches (``mapInArrow``), bare or Confluent-framed.

Spark's ``from_protobuf`` lives in the spark-protobuf jar, which Maven Central does not serve to this project's build
machines; so each executor builds the message class from the descriptor set (a ``FileDescriptorSet``, as
``protoc --include_imports --descriptor_set_out`` writes it) with the ``protobuf`` package and parses the batch's
values there, an Arrow batch at a time. The Spark schema is derived from the descriptor on the driver:

- nested messages are structs, repeated fields arrays, map fields maps, enums their value names (STRING; a number the
  descriptor does not name, which an open proto3 enum allows, is its decimal text);
- int32/sint32/sfixed32 INT, int64/sint64/sfixed64 and uint32/fixed32 BIGINT, uint64/fixed64 DECIMAL(20,0),
  float FLOAT, double DOUBLE, bool BOOLEAN, string STRING, bytes BINARY; ``google.protobuf.Timestamp`` a TIMESTAMP
  (microseconds) and the wrapper messages (``Int64Value``, ``StringValue``, ..) their scalar;
- a field with presence (a message, proto3 ``optional``, a oneof member, any proto2 optional field) that the record
  does not set is NULL; a proto3 scalar without presence is its value, the default (0, "", false, the first enum
  value) when unset: the wire format cannot tell an unset one from a default one. A repeated field is never NULL.

Confluent framing is magic byte 0, the schema id (4 bytes, big-endian), the message-index list (zigzag varints: a
count, then the indexes, a path through the schema file's messages; the count 0 alone means ``[0]``), then the
message. The index path must lead, in the descriptor's file, to the declared message; the schema id is not checked
(the descriptor is the reader's: Protobuf reads older and newer writers of the message by field number).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_eo.core.config import Framing
from airflow_eo.core.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

HEADER_BYTES = 5  # Confluent framing: magic byte + 4-byte schema id, before the message-index list
ERROR_SUFFIX = "_error"

# FieldDescriptor.TYPE_* (the descriptor.proto numbers: stable across protobuf versions)
_DOUBLE, _FLOAT, _INT64, _UINT64, _INT32, _FIXED64, _FIXED32, _BOOL, _STRING = 1, 2, 3, 4, 5, 6, 7, 8, 9
_GROUP, _MESSAGE, _BYTES, _UINT32, _ENUM, _SFIXED32, _SFIXED64, _SINT32, _SINT64 = 10, 11, 12, 13, 14, 15, 16, 17, 18
_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = {f"google.protobuf.{n}Value" for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool",
                                                   "String", "Bytes")}
_CLASSES: dict[tuple[bytes, str], Any] = {}  # message classes by (descriptor set, name): one pool per executor


def load_descriptor_set(path: str) -> bytes:
    """The bytes of a descriptor set file, checked to be one (a ``ConfigurationError`` says why not)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        blob = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"protobuf_descriptor={path!r} is not a readable file: {exc}") from exc
    try:
        descriptor_pb2.FileDescriptorSet.FromString(blob)
    except DecodeError as exc:
        raise ConfigurationError(f"protobuf_descriptor={path!r} is not a FileDescriptorSet (write it with protoc "
                                 f"--include_imports --descriptor_set_out=...): {exc}") from exc
    return blob


def message_class(blob: bytes, name: str, option: str = "protobuf_message") -> Any:
    """The message class of ``name`` (full name, e.g. ``shop.Order``) in the descriptor set ``blob``; ``option``
    names where ``name`` came from, in the error when it is not there."""
    key = (blob, name)
    if key not in _CLASSES:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        files = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(blob).file}
        pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()

        def add(file_name: str) -> None:  # dependencies first: a pool builds each file as it is added
            if file_name in added:
                return
            if file_name not in files:
                raise ConfigurationError(f"protobuf_descriptor lacks {file_name!r}, imported by another file: write "
                                         "it with protoc --include_imports")
            added.add(file_name)
            for dependency in files[file_name].dependency:
                add(dependency)
            pool.Add(files[file_name])

        try:
            for file_name in files:
                add(file_name)
            descriptor = pool.FindMessageTypeByName(name)
        except KeyError as exc:
            known = sorted(m for f in files.values() for m in _message_names(f.package, f.message_type))
            raise ConfigurationError(f"{option}={name!r} is not a message of protobuf_descriptor (it has "
                                     f"{', '.join(known) or 'none'})") from exc
        except TypeError as exc:  # the pool refuses an inconsistent file
            raise ConfigurationError(f"protobuf_descriptor is not a consistent descriptor set: {exc}") from exc
        _CLASSES[key] = message_factory.GetMessageClass(descriptor)
    return _CLASSES[key]


def _message_names(prefix: str, messages: Any) -> Iterator[str]:
    for m in messages:
        full = f"{prefix}.{m.name}" if prefix else m.name
        if not m.options.map_entry:  # a map field's entry type: not a message anyone writes
            yield full
        yield from _message_names(full, m.nested_type)


def spark_schema(descriptor: Any) -> StructType:
    """The Spark struct of a message's fields (see the module docstring for the mapping)."""
    return _struct(descriptor, ())


def _struct(descriptor: Any, seen: tuple[str, ...]) -> StructType:
    from pyspark.sql.types import StructField, StructType

    if descriptor.full_name in seen:
        cycle = " -> ".join([*seen, descriptor.full_name])
        raise ConfigurationError(f"protobuf message {seen[0]!r} is recursive ({cycle}): a Spark column needs a "
                                 "finite type")
    inner = (*seen, descriptor.full_name)
    return StructType([StructField(f.name, _field_type(f, inner), True) for f in descriptor.fields])


def _field_type(field: Any, seen: tuple[str, ...]) -> DataType:
    from pyspark.sql.types import ArrayType, MapType

    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return MapType(_single_type(key, seen), _single_type(value, seen), True)
    single = _single_type(field, seen)
    return ArrayType(single, True) if _is_repeated(field) else single


def _single_type(field: Any, seen: tuple[str, ...]) -> DataType:
    from pyspark.sql import types as T

    kind = field.type
    if kind in (_MESSAGE, _GROUP):
        name = field.message_type.full_name
        if name == _TIMESTAMP:
            return T.TimestampType()
        if name in _WRAPPERS:
            return _single_type(field.message_type.fields_by_name["value"], seen)
        return _struct(field.message_type, seen)
    simple: dict[int, DataType] = {
        _DOUBLE: T.DoubleType(), _FLOAT: T.FloatType(), _INT64: T.LongType(), _SINT64: T.LongType(),
        _SFIXED64: T.LongType(), _UINT64: T.DecimalType(20, 0), _FIXED64: T.DecimalType(20, 0),
        _INT32: T.IntegerType(), _SINT32: T.IntegerType(), _SFIXED32: T.IntegerType(), _UINT32: T.LongType(),
        _FIXED32: T.LongType(), _BOOL: T.BooleanType(), _STRING: T.StringType(), _BYTES: T.BinaryType(),
        _ENUM: T.StringType()}
    return simple[kind]


def _is_repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # newer protobuf; ``label`` is deprecated there
    return bool(flag) if flag is not None else field.label == 3


def _is_map(field: Any) -> bool:
    return (field.type == _MESSAGE and _is_repeated(field)
            and bool(field.message_type.GetOptions().map_entry))


def decode_protobuf(df: DataFrame, column: str, blob: bytes, message: str, framing: Framing, tag: str, what: str
                    ) -> tuple[DataFrame, list[str], Column]:
    """``df`` with the binary ``column`` decoded into the struct column ``tag``; the field names and the error
    expression (NULL when good; a NULL ``column`` is the caller's to judge)."""
    from functools import partial

    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    struct = spark_schema(message_class(blob, message).DESCRIPTOR)
    out = StructType([*df.schema.fields, StructField(tag, struct, True),
                      StructField(tag + ERROR_SUFFIX, StringType(), True)])
    decode = partial(decode_batches, blob, message, framing is Framing.CONFLUENT, column, what, struct.json(), tag)
    return df.mapInArrow(decode, out), [f.name for f in struct.fields], F.col(tag + ERROR_SUFFIX)


def decode_batches(blob: bytes, message: str, framed: bool, column: str, what: str, struct_json: str, tag: str,
                   batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """On an executor: each batch with two more columns, the decoded message (a struct, NULL for a bad record)
    and the error (NULL for a good one). Needs only pyspark, pyarrow and protobuf."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    cls = message_class(blob, message)
    arrow = to_arrow_type(StructType.fromJson(json.loads(struct_json)))
    for batch in batches:
        rows: list[dict[str, Any] | None] = []
        errors: list[str | None] = []
        for value in batch.column(batch.schema.get_field_index(column)).to_pylist():
            row, error = (None, None) if value is None else decode_one(cls, value, framed, what)
            rows.append(row)
            errors.append(error)
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, _arrow_rows(rows, errors, arrow, what), pa.array(errors, type=pa.string())],
            names=[*batch.schema.names, tag, tag + ERROR_SUFFIX])


def _arrow_rows(rows: list[dict[str, Any] | None], errors: list[str | None], arrow: Any, what: str) -> pa.Array:
    """The decoded rows as one Arrow array; a row Arrow refuses (a value Spark's type cannot hold) becomes a bad
    record here (its error set, its row NULL) instead of failing the whole task. Tried whole first: one pass in the
    usual case, one row at a time only for a batch that holds such a row."""
    import pyarrow as pa

    try:
        return pa.array(rows, type=arrow)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        pass
    for i, row in enumerate(rows):
        if row is None:
            continue
        try:
            pa.array([row], type=arrow)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            rows[i], errors[i] = None, f"{what}: a value Spark cannot hold: {type(exc).__name__}: {exc}"
    return pa.array(rows, type=arrow)


class _Bad(Exception):
    pass


def decode_one(cls: Any, value: bytes, framed: bool, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """One record's message as a row (a dict), or None and why it is a bad record."""
    descriptor = cls.DESCRIPTOR
    try:
        payload = _unframe(descriptor, value, what) if framed else value
        parsed = cls.FromString(payload)
    except _Bad as exc:
        return None, str(exc)
    except Exception as exc:  # upb raises DecodeError, the other backends RuntimeError or ValueError for some
        return None, f"{what}: not a {descriptor.full_name} message (truncated or corrupt): {exc}"
    try:
        return _row(parsed), None
    except Exception as exc:  # a value of this one record (a Timestamp beyond year 9999: OverflowError, ...)
        return None, f"{what}: a {descriptor.full_name} message with a value Spark cannot hold: " \
                     f"{type(exc).__name__}: {exc}"


def _unframe(descriptor: Any, data: bytes, what: str) -> bytes:
    """The message bytes of a Confluent-framed value, after checking its index path leads to ``descriptor``."""
    if len(data) < HEADER_BYTES:
        raise _Bad(f"{what} is {len(data)} bytes, shorter than the Confluent header (magic byte 0 + 4-byte schema id)")
    if data[0] != 0:
        raise _Bad(f"{what} starts with byte 0x{data[0]:02X}, not the Confluent magic byte 0x00 (framing='confluent')")
    schema_id = int.from_bytes(data[1:HEADER_BYTES], "big")
    count, position = _zigzag(data, HEADER_BYTES, what)
    if not 0 <= count <= len(data):
        raise _Bad(f"{what}: schema id {schema_id}: message-index count {count} is not a count")
    path = [0] if count == 0 else []
    for _ in range(count):
        index, position = _zigzag(data, position, what)
        path.append(index)
    target = _follow(descriptor.file, path)
    if target is None:
        raise _Bad(f"{what}: schema id {schema_id}: message index {path} is not a message of "
                   f"{descriptor.file.name} in protobuf_descriptor")
    if target.full_name != descriptor.full_name:
        option = "protobuf_message" if what == "value" else f"{what}_protobuf_message"
        raise _Bad(f"{what}: schema id {schema_id}: message index {path} is {target.full_name}, not the declared "
                   f"{option} {descriptor.full_name}")
    return data[position:]


def _zigzag(data: bytes, position: int, what: str) -> tuple[int, int]:
    """A zigzag varint at ``position`` of ``data``, and the position after it."""
    shift = result = 0
    while True:
        if position >= len(data) or shift > 63:
            raise _Bad(f"{what}: the Confluent message-index list is truncated or malformed")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position


def _follow(file: Any, path: list[int]) -> Any:
    """The message the index path names in ``file`` (top-level messages, then nested ones), or None."""
    messages = list(file.message_types_by_name.values())
    found = None
    for index in path:
        if not 0 <= index < len(messages):
            return None
        found = messages[index]
        messages = list(found.nested_types)
    return found


def _row(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            entry = field.message_type.fields_by_name
            out[field.name] = [(_single(entry["key"], k), _single(entry["value"], v)) for k, v in value.items()]
        elif _is_repeated(field):
            out[field.name] = [_single(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _single(field, value)
    return out


def _single(field: Any, value: Any) -> Any:
    kind = field.type
    if kind == _ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    if kind in (_MESSAGE, _GROUP):
        name = field.message_type.full_name
        if name == _TIMESTAMP:
            from datetime import datetime, timedelta, timezone

            return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=value.seconds,
                                                                         microseconds=value.nanos // 1000)
        if name in _WRAPPERS:
            return _single(field.message_type.fields_by_name["value"], value.value)
        return _row(value)
    if kind in (_UINT64, _FIXED64):
        return Decimal(value)
    if kind == _STRING and isinstance(value, bytes):  # proto2 does not check UTF-8: upb hands the raw bytes over
        raise ValueError(f"string field {field.name!r} is not valid UTF-8 ({value[:16]!r})")
    return value
