"""Recorded Debezium change events (``tests/fixtures/debezium``, JSON, written by a real Debezium) converted to Avro and
Protobuf, for the tests of ``changes="debezium"`` with ``value_format="avro"`` / ``"protobuf"``.

No schema registry runs on the build machines and Debezium's Avro / Protobuf converters (Confluent's, Apicurio's) do
not resolve from Maven Central, so no Debezium here writes Avro or Protobuf. These bytes are the recorded JSON events
re-encoded: the schemas are made from the Kafka Connect schema each recorded event carries (``with_schema/``) by the
rules of Confluent's converters (``AvroData``: a struct is a record named by the Connect name's last part in the
namespace of the rest, an optional field a union with null, null default first, a named struct used again referred to
by its full name, ``connect.*`` properties; ``ProtobufData`` with ``optional.for.nullables``: a struct is a message,
an optional scalar a proto3 ``optional``), and the values are the events' ``payload``.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "debezium"
#: The schema id the Confluent-framed tests give each table's envelope (as a registry would).
SCHEMA_IDS = {"eo_fixture_customers": 1, "eo_fixture_customers_default": 2}
_AVRO_TYPES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
               "float64": "double", "boolean": "boolean", "string": "string", "bytes": "bytes"}


def recorded(case: str) -> list[dict[str, Any]]:
    """The records of a case, each with its ``value`` as the JSON converter with schemas wrote it."""
    return json.loads((FIXTURES / "with_schema" / f"{case}.json").read_text())["records"]


def table_of(record: dict[str, Any]) -> str:
    return record["topic"].rsplit(".", 1)[-1]


def envelope_connect_schema(table: str) -> dict[str, Any]:
    """The Connect schema of the value of ``table``'s change events, as the recorded events carry it."""
    for case in ("read", "create", "default_identity"):
        for record in recorded(case):
            if table_of(record) == table and record["value"] is not None:
                return record["value"]["schema"]
    raise LookupError(table)


def avro_schema(connect: dict[str, Any]) -> dict[str, Any]:
    """The Avro schema Confluent's ``AvroData`` makes of a Connect struct schema."""
    return _avro(connect, set())


def _avro(connect: dict[str, Any], defined: set[str]) -> Any:
    name = connect.get("name")
    if connect["type"] == "struct":
        assert name, connect
        if name in defined:
            return name
        defined.add(name)
        namespace, _, short = name.rpartition(".")
        out: dict[str, Any] = {"type": "record", "name": short}
        if namespace:
            out["namespace"] = namespace
        fields = []
        for field in connect["fields"]:
            kind = _avro(field, defined)
            entry: dict[str, Any] = {"name": field["field"]}
            if field.get("optional"):
                if field.get("default") is not None:
                    entry.update(type=[kind, "null"], default=field["default"])
                else:
                    entry.update(type=["null", kind], default=None)
            else:
                entry["type"] = kind
            fields.append(entry)
        out["fields"] = fields
    else:
        out = {"type": _AVRO_TYPES[connect["type"]]}
        if connect["type"] in ("int8", "int16"):
            out["connect.type"] = connect["type"]
    if "version" in connect:
        out["connect.version"] = connect["version"]
    if "parameters" in connect:
        out["connect.parameters"] = connect["parameters"]
    if connect.get("default") is not None and connect["type"] != "struct":
        out["connect.default"] = connect["default"]
    if name:
        out["connect.name"] = name
    return out if len(out) > 1 or out["type"] == "record" else out["type"]


def avro_bytes(schema: dict[str, Any], payload: dict[str, Any], schema_id: int | None) -> bytes:
    """``payload`` in Avro's binary encoding; Confluent-framed with ``schema_id`` unless it is None."""
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), payload)
    body = out.getvalue()
    return body if schema_id is None else b"\x00" + struct.pack(">I", schema_id) + body


def protobuf_descriptor_set(connect: dict[str, Any]) -> Any:
    """A ``FileDescriptorSet`` of one file: the envelope (its first message, index [0]) and the messages of its
    structs, as ``ProtobufData`` makes them (nullable scalars proto3 ``optional``)."""
    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    scalar = {"int8": F.TYPE_INT32, "int16": F.TYPE_INT32, "int32": F.TYPE_INT32, "int64": F.TYPE_INT64,
              "float32": F.TYPE_FLOAT, "float64": F.TYPE_DOUBLE, "boolean": F.TYPE_BOOL, "string": F.TYPE_STRING,
              "bytes": F.TYPE_BYTES}
    package = connect["name"].rpartition(".")[0]
    proto = descriptor_pb2.FileDescriptorProto(name="envelope.proto", package=package, syntax="proto3")
    made: dict[str, str] = {}

    def message(schema: dict[str, Any]) -> str:
        name = schema["name"].rpartition(".")[2]
        if schema["name"] in made:
            return made[schema["name"]]
        made[schema["name"]] = f".{package}.{name}"
        out = proto.message_type.add(name=name)
        for number, field in enumerate(schema["fields"], start=1):
            entry = out.field.add(name=field["field"], number=number, label=F.LABEL_OPTIONAL)
            if field["type"] == "struct":
                entry.type, entry.type_name = F.TYPE_MESSAGE, message(field)
            else:
                entry.type = scalar[field["type"]]
                if field.get("optional"):  # a synthetic oneof of its own: presence
                    entry.oneof_index, entry.proto3_optional = len(out.oneof_decl), True
                    out.oneof_decl.add(name=f"_{field['field']}")
        return made[schema["name"]]

    message(connect)
    out = descriptor_pb2.FileDescriptorSet()
    out.file.append(proto)
    return out


def protobuf_bytes(message_class: Any, payload: dict[str, Any], schema_id: int | None) -> bytes:
    """``payload`` as the message; Confluent-framed (the message-index list ``[0]``: the count 0) unless
    ``schema_id`` is None."""

    def fill(message: Any, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if value is None or name not in message.DESCRIPTOR.fields_by_name:
                continue
            if isinstance(value, dict):
                fill(getattr(message, name), value)
            else:
                setattr(message, name, value)

    message = message_class()
    fill(message, payload)
    body = message.SerializeToString()
    return body if schema_id is None else b"\x00" + struct.pack(">I", schema_id) + b"\x00" + body
