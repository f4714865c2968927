"""The pipeline's options as validated value objects: every option check lives here, once.

A DAG builds these at parse time (the operator), so a misconfigured pipeline never
starts a batch; the engine and the protocol take them as already valid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeVar

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


class BadRecordPolicy(str, Enum):
    """What a record that fails to parse does to its batch."""

    FAIL = "fail"  # the batch fails naming the record; nothing is committed
    DEAD_LETTER = "dead_letter"  # written to the dead-letter table, atomically with the batch


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


def table_sink_keys_and_updates(name: str, key_columns: Any, updates: Mapping[str, UpdateMode | str],
                                accumulates: bool, two_phase_kind: str
                                ) -> tuple[tuple[str, ...], dict[str, UpdateMode]]:
    """The checked ``key_columns`` and ``updates`` of a table sink spec (MySQL's, PostgreSQL's): a non-empty list of
    valid names; per column ``replace`` or ``add``, the latter only where the kind ``accumulates`` (two-phase).

    :param name: the spec's kind, for messages.
    :param two_phase_kind: the kind that takes accumulating updates, which the message of a refusal names.
    """
    if not key_columns or isinstance(key_columns, str):
        raise ConfigurationError(f"{name}: key_columns must be a non-empty list of column names")
    keys = tuple(validate_identifier(key, "key column") for key in key_columns)
    checked = {}
    for column, mode in updates.items():
        validate_identifier(column, "column name")
        checked[column] = choice(UpdateMode, mode, f"{name}: update mode of column {column!r}", "update modes")
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

    :param value_format: ``json`` (needs ``schema``), ``string`` or ``bytes``.
    :param schema: Spark DDL of JSON values; ``NOT NULL`` fields are required.
    :param on_bad_record: ``fail`` (default) or ``dead_letter``.
    :param write_partitions: Spark tasks (connections, XA branches) writing the output; None: the
        cluster's default parallelism.
    """

    value_format: ValueFormat = ValueFormat.JSON
    schema: str | None = None
    on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL
    write_partitions: int | None = None

    def __post_init__(self) -> None:
        value_format = choice(ValueFormat, self.value_format, "value_format", "value formats")
        object.__setattr__(self, "value_format", value_format)
        object.__setattr__(self, "on_bad_record", choice(BadRecordPolicy, self.on_bad_record, "on_bad_record",
                                                         "policies"))
        if self.value_format is ValueFormat.JSON and not self.schema:
            raise ConfigurationError("value_format='json' needs schema= (Spark DDL, e.g. 'id STRING NOT NULL, n INT')")
        if self.write_partitions is not None and self.write_partitions < 1:
            raise ConfigurationError("write_partitions must be a positive number of Spark tasks (or None)")


class SinkTraits(Protocol):
    """What the pipeline rules need to know of a sink (its spec or its adapter)."""

    @property
    def name(self) -> str: ...
    @property
    def replay_safe(self) -> bool: ...
    @property
    def keeps_dead_letters(self) -> bool: ...


def check_pipeline(sink: SinkTraits, mode: Mode, parse: ParseConfig, max_records_per_run: int | None) -> None:
    """The rules that tie a sink to the pipeline's mode and options (checked at DAG parse time)."""
    if max_records_per_run is not None and max_records_per_run < 1:
        raise ConfigurationError("max_records_per_run must be a positive number of records (or None)")
    if parse.on_bad_record is BadRecordPolicy.DEAD_LETTER and not sink.keeps_dead_letters:
        raise ConfigurationError(f"{sink.name} supports on_bad_record='fail' only (no dead-letter table)")
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
