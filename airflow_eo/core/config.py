"""The pipeline's options as validated value objects: every option check lives here, once.

A DAG builds these at parse time (the operator), so a misconfigured pipeline never
starts a batch; the engine and the protocol take them as already valid.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, TypeVar

from airflow_eo.core.changes import ChangeFormat, TruncatePolicy, check_avro_envelope
from airflow_eo.core.dedup import DEFAULT_RETENTION, check_dedup
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_identifier


class Mode(str, Enum):
    """How a run's batch is chosen (see ``docs/architecture.md``)."""

    CONTINUOUS = "continuous"  # each batch starts where the last committed one ended
    INTERVAL = "interval"  # the batch is the run's data interval; clears and backfills replay it


class ValueFormat(str, Enum):
    """How a Kafka record's value is parsed."""

    JSON = "json"  # with a Spark DDL schema
    STRING = "string"
    BYTES = "bytes"
    AVRO = "avro"  # with an Avro reader schema and a declared framing
    PROTOBUF = "protobuf"  # a message of a descriptor set file, with a declared framing


class KeyFormat(str, Enum):
    """How a Kafka record's key becomes the ``key`` column (the raw key stays in ``kafka_key``)."""

    BYTES = "bytes"  # no ``key`` column: the transform has the raw ``kafka_key``
    STRING = "string"
    JSON = "json"  # with key_schema as Spark DDL
    AVRO = "avro"  # with key_schema as an Avro schema, framed as the values are
    PROTOBUF = "protobuf"  # key_protobuf_message of protobuf_descriptor, framed as the values are


class Framing(str, Enum):
    """How an Avro or Protobuf payload sits in a key or value. Declared, never guessed: a raw Avro record whose first
    field is an empty string or a zero starts with byte 0 too (DESIGN.md section 11)."""

    NONE = "none"  # the payload is the Avro binary of one record, written with the reader schema
    CONFLUENT = "confluent"  # magic byte 0, the writer schema's id (4 bytes, big-endian), then the Avro binary
    # (Protobuf: the message-index list, zigzag varints, between the id and the message)


#: A field the engine adds to an Avro reader schema (with a default) to tell a record that failed to decode (Spark
#: then returns a row of NULLs) from one whose fields are all NULL; a user's schema must not use the name.
AVRO_DECODED_FIELD = "_eo_decoded"


class BadRecordPolicy(str, Enum):
    """What a record that fails to parse does to its batch."""

    FAIL = "fail"  # the batch fails naming the record; nothing is committed
    DEAD_LETTER = "dead_letter"  # written to the dead-letter table, atomically with the batch


class TombstonePolicy(str, Enum):
    """What a record with a null value (a Kafka tombstone) does."""

    BAD_RECORD = "bad_record"  # a bad record, as any record without a value (``on_bad_record`` decides)
    DELETE = "delete"  # deletes the row its Kafka key names (upsert table sinks, no transform)


#: The column that marks a tombstone's row (True: delete the row of its key columns) on its way to a sink that
#: deletes; never a column of the table.
DELETE_COLUMN = "_eo_delete"


def tombstone_policy(name: str, value: TombstonePolicy | str, deletes: bool, reason: str) -> TombstonePolicy:
    """A sink spec's checked ``on_tombstone``; ``delete`` only where the kind ``deletes`` (``reason`` says why not)."""
    policy = choice(TombstonePolicy, value, f"{name}: on_tombstone", "tombstone policies")
    if policy is TombstonePolicy.DELETE and not deletes:
        raise ConfigurationError(f"{name}: on_tombstone='delete' is not supported: {reason}")
    return policy


class UpdateMode(str, Enum):
    """How a table sink (MySQL, PostgreSQL) updates a non-key column of an existing row."""

    REPLACE = "replace"  # c = new c: replay-safe
    ADD = "add"  # c = c + new c: accumulating, transactional sinks only


E = TypeVar("E", bound=Enum)


def choice(enum: type[E], value: E | str, option: str, label: str) -> E:
    """``value`` as a member of ``enum``; a clear error naming the option and its choices otherwise."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        names = ", ".join(str(m.value) for m in enum)
        raise ConfigurationError(f"{option}={value!r}: supported {label} are {names}") from None


def update_mode(name: str, column: str, mode: UpdateMode | str,
                validate: Callable[[str, str], str] = validate_identifier) -> UpdateMode:
    """A column's checked name and update mode (``replace`` / ``add``) in a table sink spec ``name``."""
    validate(column, "column name")
    return choice(UpdateMode, mode, f"{name}: update mode of column {column!r}", "update modes")


def lakehouse_keys_and_updates(name: str, key_columns: Any, updates: Mapping[str, UpdateMode | str],
                               ) -> tuple[tuple[str, ...], dict[str, UpdateMode]]:
    """The checked ``key_columns`` and ``updates`` of a lakehouse table sink (Delta's, Iceberg's): no keys means
    append (and then no updates); with keys, a ``MERGE`` whose non-key columns are ``replace``d or ``add``ed."""
    if isinstance(key_columns, str):
        raise ConfigurationError(f"{name}: key_columns must be a list of column names")
    keys = tuple(validate_identifier(k, "key column") for k in key_columns)
    checked = {column: update_mode(name, column, mode) for column, mode in updates.items()}
    if checked and not keys:
        raise ConfigurationError(f"{name}: updates need key_columns (without them every row is appended)")
    if set(checked) & set(keys):
        raise ConfigurationError(f"{name}: a key column cannot have an update mode")
    return keys, checked


def table_sink_keys_and_updates(name: str, key_columns: Any, updates: Mapping[str, UpdateMode | str],
                                accumulates: bool, two_phase_kind: str,
                                validate: Callable[[str, str], str] = validate_identifier,
                                ) -> tuple[tuple[str, ...], dict[str, UpdateMode]]:
    """The checked ``key_columns`` and ``updates`` of a table sink spec (MySQL's, PostgreSQL's): a non-empty list of
    valid names; per column ``replace`` or ``add``, the latter only where the kind ``accumulates`` (two-phase).

    :param name: the spec's kind, for messages.
    :param two_phase_kind: the kind that takes accumulating updates, which the message of a refusal names.
    :param validate: the database's rule for column names (default: the portable one of
        :func:`~airflow_eo.core.identifiers.validate_identifier`).
    """
    if not key_columns or isinstance(key_columns, str):
        raise ConfigurationError(f"{name}: key_columns must be a non-empty list of column names")
    keys = tuple(validate(key, "key column") for key in key_columns)
    checked = {}
    for column, mode in updates.items():
        checked[column] = update_mode(name, column, mode, validate)
        if checked[column] is UpdateMode.ADD and not accumulates:
            raise ConfigurationError(
                f"{name}: column {column!r} uses an accumulating update ('add'), which counts a record twice when "
                f"a batch is replayed after a crash. The upsert sink only overwrites; use {two_phase_kind} for "
                "accumulating updates (its writes commit atomically with the offsets)."
            )
    return keys, checked


@dataclass(frozen=True)
class ParseConfig:
    """How the engine turns Kafka records into rows.

    :param value_format: ``json`` (needs ``schema``), ``string``, ``bytes``, ``avro`` (needs ``avro_schema`` and
        ``framing``) or ``protobuf`` (needs ``protobuf_descriptor``, ``protobuf_message`` and ``framing``).
    :param schema: Spark DDL of JSON values; ``NOT NULL`` fields are required.
    :param on_bad_record: ``fail`` (default) or ``dead_letter``.
    :param write_partitions: Spark tasks (connections, XA branches) writing the output; None: the
        cluster's default parallelism.
    """

    value_format: ValueFormat = ValueFormat.JSON
    schema: str | None = None
    on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL
    write_partitions: int | None = None
    key_format: KeyFormat = KeyFormat.BYTES
    key_schema: str | None = None
    avro_schema: str | None = None
    framing: Framing | None = None
    writer_schemas: Mapping[int, str] | str | None = None
    #: a FileDescriptorSet file (``protoc --include_imports --descriptor_set_out``) and the full name of the message
    protobuf_descriptor: str | None = None
    protobuf_message: str | None = None
    #: ``key_format="protobuf"``: the full name of the keys' message, in ``protobuf_descriptor``
    key_protobuf_message: str | None = None
    #: the sink's key columns when tombstones delete rows (``on_tombstone="delete"``); empty: they are bad records
    delete_keys: tuple[str, ...] = ()
    #: columns of the parsed record that identify an event (``dedup_key``): copies re-sent at other offsets are
    #: dropped before the transform (:mod:`airflow_eo.core.dedup`); empty: every record counts
    dedup_key: tuple[str, ...] = ()
    #: how long (in record time) an event id is remembered (``dedup_retention``)
    dedup_retention: timedelta = DEFAULT_RETENTION
    #: the values are change events of a source table (``changes=``, :mod:`airflow_eo.core.changes`): ``schema`` is
    #: the row's columns (Avro / Protobuf: optional, the envelope's ``after`` fields by default); None: a value is a row
    changes: ChangeFormat | None = None
    #: with ``changes``: the sink's key columns, which name a change's row
    change_keys: tuple[str, ...] = ()
    #: with ``changes``: what a truncate of the source table does (``on_truncate``)
    on_truncate: TruncatePolicy = TruncatePolicy.FAIL

    def __post_init__(self) -> None:
        value_format = choice(ValueFormat, self.value_format, "value_format", "value formats")
        object.__setattr__(self, "value_format", value_format)
        object.__setattr__(self, "on_bad_record", choice(BadRecordPolicy, self.on_bad_record, "on_bad_record",
                                                         "policies"))
        key_format = choice(KeyFormat, self.key_format, "key_format", "key formats")
        object.__setattr__(self, "key_format", key_format)
        if self.framing is not None:
            object.__setattr__(self, "framing", choice(Framing, self.framing, "framing", "framings"))
        if self.value_format is ValueFormat.JSON and not self.schema:
            raise ConfigurationError("value_format='json' needs schema= (Spark DDL, e.g. 'id STRING NOT NULL, n INT')")
        if self.write_partitions is not None and self.write_partitions < 1:
            raise ConfigurationError("write_partitions must be a positive number of Spark tasks (or None)")
        self._check_keys_and_avro()
        object.__setattr__(self, "dedup_key", tuple(self.dedup_key))
        if self.changes is not None:
            object.__setattr__(self, "changes", choice(ChangeFormat, self.changes, "changes", "change formats"))
            object.__setattr__(self, "change_keys", tuple(self.change_keys))
            object.__setattr__(self, "on_truncate", choice(TruncatePolicy, self.on_truncate, "on_truncate",
                                                           "policies"))
            if self.value_format not in (ValueFormat.JSON, ValueFormat.AVRO, ValueFormat.PROTOBUF):
                raise ConfigurationError(f"changes={self.changes.value!r} reads Debezium's change events in JSON "
                                         "(value_format='json', with or without the converter's schema/payload "
                                         "wrapper), Avro (value_format='avro', avro_schema= the envelope) or "
                                         "Protobuf (value_format='protobuf', protobuf_message= the envelope), not "
                                         f"value_format={self.value_format.value!r}")
            if self.value_format is ValueFormat.AVRO:
                check_avro_envelope(self.avro_schema or "")
            if not self.change_keys:
                raise ConfigurationError("changes: the sink's key columns are needed (they name a change's row)")
        if self.delete_keys:
            object.__setattr__(self, "delete_keys", tuple(self.delete_keys))
            if self.key_format is KeyFormat.BYTES:
                raise ConfigurationError(
                    "on_tombstone='delete' takes the deleted row's key columns from the Kafka key: set "
                    "key_format='string' (one key column), 'json'/'avro' with key_schema or 'protobuf' with "
                    "key_protobuf_message (the key columns by name)")
            if self.key_format is KeyFormat.STRING and len(self.delete_keys) != 1:
                raise ConfigurationError(
                    f"on_tombstone='delete' with key_format='string': the key is one value, but the sink has "
                    f"{len(self.delete_keys)} key columns ({', '.join(self.delete_keys)}); use key_format='json' "
                    "with a key_schema naming them")

    def _check_keys_and_avro(self) -> None:
        avro_value, avro_key = self.value_format is ValueFormat.AVRO, self.key_format is KeyFormat.AVRO
        protobuf_value, protobuf_key = self.value_format is ValueFormat.PROTOBUF, self.key_format is KeyFormat.PROTOBUF
        if protobuf_value and not (self.protobuf_descriptor and self.protobuf_message):
            raise ConfigurationError("value_format='protobuf' needs protobuf_descriptor= (a FileDescriptorSet file, as "
                                     "protoc --include_imports --descriptor_set_out writes) and protobuf_message= "
                                     "(the message's full name, e.g. 'shop.Order')")
        if protobuf_key and not (self.protobuf_descriptor and self.key_protobuf_message):
            raise ConfigurationError("key_format='protobuf' needs protobuf_descriptor= (a FileDescriptorSet file, as "
                                     "protoc --include_imports --descriptor_set_out writes) and key_protobuf_message= "
                                     "(the key message's full name, e.g. 'shop.OrderKey')")
        if self.protobuf_message and not protobuf_value:
            raise ConfigurationError("protobuf_message is for value_format='protobuf'")
        if self.key_protobuf_message and not protobuf_key:
            raise ConfigurationError("key_protobuf_message is for key_format='protobuf'")
        if self.protobuf_descriptor and not (protobuf_value or protobuf_key):
            raise ConfigurationError("protobuf_descriptor is for value_format='protobuf' or key_format='protobuf'")
        if self.key_format in (KeyFormat.JSON, KeyFormat.AVRO) and not self.key_schema:
            kind = "Spark DDL" if self.key_format is KeyFormat.JSON else "an Avro record schema (JSON text or a path)"
            raise ConfigurationError(f"key_format={self.key_format.value!r} needs key_schema= ({kind})")
        if self.key_schema and self.key_format not in (KeyFormat.JSON, KeyFormat.AVRO):
            raise ConfigurationError("key_schema is for key_format='json' or 'avro'")
        if avro_value and not self.avro_schema:
            raise ConfigurationError("value_format='avro' needs avro_schema= (the reader schema: an Avro record schema "
                                     "as JSON text, or the path of an .avsc file)")
        if self.avro_schema and not avro_value:
            raise ConfigurationError("avro_schema is for value_format='avro'")
        if self.writer_schemas is not None and not (avro_value or avro_key):
            raise ConfigurationError("writer_schemas are for Avro keys or values")
        if not (avro_value or avro_key or protobuf_value or protobuf_key):
            if self.framing is not None:
                raise ConfigurationError("framing is for Avro or Protobuf keys or values")
            return
        if self.framing is None:
            raise ConfigurationError(
                "Avro or Protobuf keys or values need framing='confluent' (magic byte 0 + a 4-byte schema id, "
                "then the record) or framing='none' (the bare record): the first byte cannot tell them apart, since "
                "a bare record may start with byte 0 too")
        if avro_value:
            object.__setattr__(self, "avro_schema", avro_record_schema(self.avro_schema or "", "avro_schema"))
        if avro_key:
            object.__setattr__(self, "key_schema", avro_record_schema(self.key_schema or "", "key_schema"))
        if self.writer_schemas is not None:
            if self.framing is not Framing.CONFLUENT:
                raise ConfigurationError("writer_schemas are found by the schema id of framing='confluent'; with "
                                         "framing='none' every record is written with the reader schema")
            object.__setattr__(self, "writer_schemas", writer_schemas_by_id(self.writer_schemas))

    @property
    def writer_schema_map(self) -> Mapping[int, str]:
        """The supplied writer schemas by id (JSON text), after ``__post_init__`` loaded them."""
        return self.writer_schemas if isinstance(self.writer_schemas, Mapping) else {}


def avro_record_schema(text_or_path: str, option: str) -> str:
    """An Avro record schema as compact JSON text, from JSON text or the path of a file holding it."""
    text = text_or_path.strip()
    if not text.startswith(("{", "[", '"')):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise ConfigurationError(f"{option}={text_or_path!r} is neither Avro schema JSON nor a readable file: "
                                     f"{exc}") from exc
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{option}: not valid JSON ({exc})") from exc
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        raise ConfigurationError(f"{option}: the schema must be an Avro record ({{\"type\": \"record\", \"name\": .., "
                                 "\"fields\": [..]}): its fields become columns")
    if any(isinstance(f, dict) and f.get("name") == AVRO_DECODED_FIELD for f in schema["fields"]):
        raise ConfigurationError(f"{option}: the field name {AVRO_DECODED_FIELD!r} is reserved by airflow_eo")
    return json.dumps(schema, separators=(",", ":"))


def writer_schemas_by_id(source: Mapping[int, Any] | str) -> dict[int, str]:
    """Writer schemas by Confluent schema id: a mapping id -> schema (JSON text or a parsed dict), or a directory
    of ``<id>.avsc`` files."""
    if isinstance(source, str):
        folder = Path(source)
        if not folder.is_dir():
            raise ConfigurationError(f"writer_schemas={source!r} is not a directory of <id>.avsc files")
        files = {p.stem: p for p in folder.glob("*.avsc")}
        bad = sorted(s for s in files if not s.isdigit())
        if bad:
            raise ConfigurationError(f"writer_schemas: {bad} are not schema ids: name the files <id>.avsc")
        source = {int(stem): path.read_text() for stem, path in files.items()}
    out: dict[int, str] = {}
    for schema_id, schema in source.items():
        if isinstance(schema_id, str) and schema_id.isdigit():
            schema_id = int(schema_id)
        if not isinstance(schema_id, int) or not 0 <= schema_id < 2**31:
            raise ConfigurationError(f"writer_schemas: id {schema_id!r} is not a schema id (0 .. 2**31-1)")
        text = json.dumps(schema) if isinstance(schema, dict) else str(schema)
        out[schema_id] = avro_record_schema(text, f"writer_schemas[{schema_id}]")
    return out


class SinkTraits(Protocol):
    """What the pipeline rules need to know of a sink (its spec or its adapter)."""

    @property
    def name(self) -> str: ...
    @property
    def replay_safe(self) -> bool: ...
    @property
    def keeps_dead_letters(self) -> bool: ...
    @property
    def delete_keys(self) -> tuple[str, ...]: ...
    @property
    def keeps_seen_ids(self) -> bool: ...


def check_pipeline(sink: SinkTraits, mode: Mode, parse: ParseConfig, max_records_per_run: int | None,
                   has_transform: bool = False) -> None:
    """The rules that tie a sink to the pipeline's mode and options (checked at DAG parse time)."""
    if sink.delete_keys:
        if has_transform:
            # The transform would have to keep each tombstone's row, its key columns and the delete marker: a
            # filter or an aggregation silently turns a delete into nothing. Deletes are the parsed rows' own.
            raise ConfigurationError(
                f"{sink.name}: on_tombstone='delete' works without a transform only (the written rows are the "
                "parsed values, a tombstone's row keyed by its Kafka key); drop the transform or keep "
                "on_tombstone='bad_record'")
        if tuple(parse.delete_keys) != tuple(sink.delete_keys):
            raise ConfigurationError(f"{sink.name}: the parse options do not carry the sink's delete keys")
    if max_records_per_run is not None and max_records_per_run < 1:
        raise ConfigurationError("max_records_per_run must be a positive number of records (or None)")
    if parse.on_bad_record is BadRecordPolicy.DEAD_LETTER and not sink.keeps_dead_letters:
        raise ConfigurationError(f"{sink.name} supports on_bad_record='fail' only (no dead-letter table)")
    check_dedup(parse.dedup_key, parse.dedup_retention, interval_mode=mode is Mode.INTERVAL, sink_name=sink.name,
                sink_keeps_seen_ids=sink.keeps_seen_ids)
    if mode is Mode.INTERVAL:
        # Interval mode replays intervals (backfills, clears): refuse what a replay would double count.
        if not sink.replay_safe:
            raise ConfigurationError(
                f"mode='interval' with {sink.name}: a cleared or backfilled interval is replayed, so "
                "interval mode needs a replay-safe sink, MySqlUpsertSink with overwriting ('replace') updates. "
                "MySqlXaSink may accumulate and KafkaTransactionalSink appends: a replay would count the interval "
                "twice. Use mode='continuous' with them."
            )
        if max_records_per_run is not None:
            raise ConfigurationError("mode='interval': the batch is the whole data interval; drop max_records_per_run "
                                     "(or use a shorter schedule interval)")


@dataclass(frozen=True)
class SinkRecord:
    """What the offset store records of a pipeline's sink at each take (``eo_pipeline``), so that operations
    (``airflow eo``) know what they deal with without the DAG: which sink, whether reprocessing double counts,
    where dead letters go, and the spec's options to rebuild its adapter for recovery.

    :param kind: the sink spec's class name (``MySqlXaSink``, ``MySqlUpsertSink``, ``KafkaTransactionalSink``).
    :param accumulating: True when processing a record twice changes the result (XA ``add`` updates, Kafka
        appends): reprocessing offsets again (a rewind) counts them twice.
    :param conn_id: the sink's Airflow connection id (an id, never a secret).
    :param target: the table or topic written.
    :param dead_letter_table: where bad records go; None when the sink keeps none.
    :param options: the spec's fields (JSON values), enough to rebuild it.
    """

    kind: str
    accumulating: bool
    conn_id: str | None = None
    target: str | None = None
    dead_letter_table: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "accumulating": self.accumulating, "conn_id": self.conn_id,
                           "target": self.target, "dead_letter_table": self.dead_letter_table,
                           "options": dict(self.options)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SinkRecord:
        data = json.loads(text)
        return cls(kind=str(data["kind"]), accumulating=bool(data["accumulating"]), conn_id=data.get("conn_id"),
                   target=data.get("target"), dead_letter_table=data.get("dead_letter_table"),
                   options=dict(data.get("options") or {}))
