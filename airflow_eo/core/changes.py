"""Change streams (``changes="debezium"``): a database's changes applied in source order, exactly once
(``docs/architecture.md``, "Change data capture"; DESIGN.md section 15).

A change event carries its own order: the source's log position. Kafka's order is only per partition, and a
connector restarted from an older offset, a re-snapshot or a replayed batch re-sends changes; so a change applies to a
row only when its position is newer than the position of the change that wrote the row. The position lives with the
row, in the sink's database (the change-position table, one row per target key, written with the output: the target
table keeps only the source's columns), and a delete leaves its position there as a marker (kept
``delete_retention``), so that an older create re-sent after the delete does not bring the row back.

This module decides, in plain Python: the position of a change (a byte string whose byte order is the source's log
order), which of a key's changes in a batch wins, whether it is newer than the row's, and which pipelines may read
changes. ``spark/changes.py`` computes the same positions where the records are (its tests compare both on
recorded events).

Positions, by source connector (Debezium's ``source`` block):

- PostgreSQL: ``sequence`` is ``[last commit LSN, LSN]`` (DBZ-2911): events are emitted in commit order and each
  carries the end LSN of the commit before its transaction, so ``(last commit LSN, LSN)`` orders changes as the source
  committed them (an LSN alone does not: concurrent transactions interleave their LSNs). Debezium leaves the first
  part null for the first transaction it streams (after a snapshot, after a restart): the change's own LSN stands in,
  which is past every earlier change of the same row (a row's next writer waits for its last one's commit). A
  snapshot read (``op="r"``) reflects every transaction committed before the snapshot's LSN: ``(snapshot LSN, 0)``,
  after every change committed before it, so a re-snapshot (a connector registered afresh) repairs rows whose
  changes were never streamed. Not ordered exactly: the first transaction streamed after a snapshot, when it began
  before the snapshot and changed a row before the snapshot's LSN (Debezium says nothing of its own commit): the
  snapshot's older image wins until the row's next change.
- MySQL / MariaDB: ``(binlog file number, position, row)``; a snapshot read ``(file number, position, 0)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from airflow_eo.core.errors import ConfigurationError


class ChangeFormat(str, Enum):
    """How a record's value describes a change of a source row (``changes=``)."""

    DEBEZIUM = "debezium"


#: The change's position (BINARY, 16 bytes: :func:`postgres_position` / :func:`mysql_position`) in the parsed rows.
POSITION_COLUMN = "_eo_position"
#: What a transform sees of a change besides the row's columns: its ``op`` (c, r, u, d) and its position.
CHANGE_OP = "change_op"
CHANGE_POSITION = "change_position"
#: Debezium's operations that write the ``after`` image (create, snapshot read, update) and the delete.
UPSERT_OPS = ("c", "r", "u")
DELETE_OP = "d"
TRUNCATE_OP = "t"
#: How long a delete's marker is kept (by the deleted record's Kafka timestamp): a change older than the delete that
#: arrives later than this (a connector restarted from an offset older than that) could bring the row back.
DEFAULT_DELETE_RETENTION = timedelta(days=7)
#: The change-position table's columns, as the engine's rows carry them: the pipeline, the target key's id (16 bytes
#: of a hash of its values), the position, 1 for a delete marker, the change's Kafka timestamp (epoch ms: the
#: markers' retention) and the batch that applied it; one row per pipeline and key.
CHANGE_POSITION_FIELDS = ("pipeline_key", "key_id", "position", "deleted", "changed_at", "batch_id")
CHANGE_POSITION_KEY = ("pipeline_key", "key_id")
#: In a table format's target (``merges_changes``): the column the sink adds to the table holding the position of the
#: change that wrote each row (its 32 lowercase hex digits: text order is position order), and the side table of delete
#: markers beside the target (its name or path plus this suffix: the key columns, the position, the delete's Kafka
#: timestamp in :data:`DELETED_AT`).
TABLE_POSITION_COLUMN = "_eo_change_position"
DELETE_MARKERS_SUFFIX = "_eo_delete_markers"
DELETED_AT = "_eo_deleted_at"
#: The column of a change's Kafka timestamp as the engine passes changes to a table format (a marker's time).
CHANGED_AT = "kafka_timestamp"
#: The change-position table's key id of a pipeline's truncate floor (key ids are hashes of key values: no key has it).
TRUNCATE_KEY = bytes(16)
#: Bytes of a position: two big-endian unsigned 64-bit numbers.
POSITION_BYTES = 16


class TruncatePolicy(str, Enum):
    """What a truncate event (``op="t"``) does: fail the batch (default: a table emptied at the source is rarely
    what a replica should repeat unasked) or empty the target table (``on_truncate="truncate"``: the target's rows
    are deleted once, and the truncate's position becomes the floor every later change of any key must be newer
    than, kept in the change-position table under :data:`TRUNCATE_KEY` like a delete marker)."""

    FAIL = "fail"
    TRUNCATE = "truncate"


def postgres_position(op: str, lsn: int | None, sequence: str | None) -> bytes:
    """The position of a Debezium PostgreSQL change: ``(last commit LSN, LSN)`` (the module's docstring).

    :param op: the event's ``op``.
    :param lsn: ``source.lsn``.
    :param sequence: ``source.sequence``, a JSON array of two LSNs as strings (either may be null).
    """
    last_commit: int | None = None
    current = lsn or 0
    if sequence:
        parts = json.loads(sequence)
        last_commit = int(parts[0]) if parts and parts[0] is not None else None
        if len(parts) > 1 and parts[1] is not None:
            current = int(parts[1])
    if op == "r":
        return _pack(current, 0)
    return _pack(current if last_commit is None else last_commit, current)


def mysql_position(op: str, file: str | None, pos: int | None, row: int | None) -> bytes:
    """The position of a Debezium MySQL / MariaDB change: ``(binlog file number, position, row)``, the row 0 for a
    snapshot read (its position is the snapshot's binlog coordinates)."""
    number = int(file.rsplit(".", 1)[-1]) if file and file.rsplit(".", 1)[-1].isdigit() else 0
    return _pack(number, ((pos or 0) << 24) | (0 if op == "r" else (row or 0) + 1))


def _pack(high: int, low: int) -> bytes:
    return high.to_bytes(8, "big") + low.to_bytes(8, "big")


def position_partition(partition: int) -> int:
    """The partition number (in its xid) of the change-position writer of Spark partition ``partition``: its own
    branch or transaction, never that of the output (``partition``), of the dead letters (-2 - partition), of the
    seen ids (-2**30 - partition) or of the driver (-1)."""
    return (1 << 30) + partition


def newer(position: bytes, applied: bytes | None) -> bool:
    """Whether a change at ``position`` applies over a row whose last applied change (or delete marker) is at
    ``applied`` (None: the row has no recorded change). Equal is not newer: a re-sent change is a no-op."""
    return applied is None or position > applied


@dataclass(frozen=True)
class Change:
    """One change of a batch as :func:`winners` sees it (plain data, for the pure decision and its tests)."""

    key: tuple[object, ...]
    position: bytes
    op: str


def winners(changes: list[Change], applied: Mapping[tuple[object, ...], bytes]) -> dict[tuple[object, ...], Change]:
    """Per key, the batch's newest change by position when it is newer than the row's applied one: what the sink
    writes (an upsert of ``after``, or a delete and its marker). A key whose newest change is not newer is left as it
    is."""
    newest: dict[tuple[object, ...], Change] = {}
    for change in changes:
        known = newest.get(change.key)
        if known is None or change.position > known.position:
            newest[change.key] = change
    return {key: c for key, c in newest.items() if newer(c.position, applied.get(key))}


def check_changes(changes: ChangeFormat | str | None, *, sink_name: str, takes_changes: bool,
                  key_columns: tuple[str, ...], accumulating: bool, interval_mode: bool,
                  dedup_key: tuple[str, ...], on_truncate: TruncatePolicy | str = TruncatePolicy.FAIL,
                  truncates: bool = False) -> ChangeFormat | None:
    """The pipeline rules of ``changes=`` (at DAG parse time): the format, and a sink that applies changes by key."""
    try:
        policy = TruncatePolicy(on_truncate)
    except ValueError:
        raise ConfigurationError(f"on_truncate={on_truncate!r}: choose one of "
                                 f"{', '.join(p.value for p in TruncatePolicy)}") from None
    if changes is None:
        if policy is not TruncatePolicy.FAIL:
            raise ConfigurationError("on_truncate is for change streams (changes='debezium')")
        return None
    try:
        chosen = ChangeFormat(changes)
    except ValueError:
        raise ConfigurationError(f"changes={changes!r} is not a change format; choose one of "
                                 f"{', '.join(f.value for f in ChangeFormat)}") from None
    if not takes_changes:
        raise ConfigurationError(
            f"changes={chosen.value!r} with {sink_name}: a change stream deletes rows and applies a change only when "
            "its source position is newer than the row's, which this sink does not do (the two-phase sinks delete no "
            "rows, a topic appends). Use MySqlUpsertSink, PostgresUpsertSink, DeltaTableSink or IcebergTableSink "
            "with key_columns (the source table's primary key): replays are no-ops by the positions")
    if not key_columns:
        raise ConfigurationError(f"changes={chosen.value!r}: {sink_name} needs key_columns (the source table's "
                                 "primary key): a change names its row by them")
    if accumulating:
        raise ConfigurationError(f"changes={chosen.value!r}: {sink_name}'s 'add' updates would add a row's new "
                                 "image to its old one; a change replaces the row (drop the 'add' updates)")
    if interval_mode:
        raise ConfigurationError(f"changes={chosen.value!r} runs in mode='continuous': a change stream is applied in "
                                 "source order, whatever Kafka time interval its records fall in")
    if dedup_key:
        raise ConfigurationError(f"changes={chosen.value!r} with dedup_key: a change carries its source position, "
                                 "so a re-sent change is a no-op already; drop dedup_key")
    if policy is TruncatePolicy.TRUNCATE and not truncates:
        raise ConfigurationError(f"on_truncate='truncate' with {sink_name}: emptying the target once per truncate is "
                                 "built for MySqlUpsertSink and PostgresUpsertSink (their change-position table holds "
                                 "the truncate's floor); not yet for the table formats")
    return chosen


#: The fields of Debezium's change event envelope a decoded (Avro / Protobuf) event must have.
ENVELOPE_FIELDS = ("before", "after", "op", "source")


def check_avro_envelope(schema: str) -> None:
    """That an Avro reader schema (``avro_schema`` with ``changes=``, JSON text) is Debezium's change event envelope
    as its Avro converter registers it: a record with ``op`` (a string), ``before`` and ``after`` (the row's record,
    nullable) and ``source`` (a record with ``lsn``, or ``file`` and ``pos``)."""
    fields = {f.get("name"): f.get("type") for f in json.loads(schema)["fields"] if isinstance(f, dict)}
    missing = [name for name in ENVELOPE_FIELDS if name not in fields]
    hint = ("give the value schema Debezium's AvroConverter registers for the table's topic (the record "
            "'Envelope': before, after, source, op, ts_ms, transaction)")
    if missing:
        raise ConfigurationError(f"changes='debezium': avro_schema is no Debezium change event envelope: it has no "
                                 f"{', '.join(repr(m) for m in missing)}; {hint}")
    if _avro_branch(fields["op"], "string") is None:
        raise ConfigurationError(f"changes='debezium': avro_schema's 'op' is {fields['op']!r}, not a string; {hint}")
    images = {name: _avro_branch(fields[name], "record") for name in ("before", "after")}
    for name, image in images.items():
        if image is None:
            raise ConfigurationError(f"changes='debezium': avro_schema's {name!r} is not a record (the row's image, "
                                     f"nullable); {hint}")
    source = _avro_branch(fields["source"], "record")
    # A record named by reference (defined earlier in the schema) is taken on trust: Spark checks it when it decodes.
    listed = source.get("fields") if isinstance(source, dict) else [{"name": "lsn"}]
    source_fields = {f.get("name") for f in listed if isinstance(f, dict)} if isinstance(listed, list) else set()
    if source is None or not ("lsn" in source_fields or {"file", "pos"} <= source_fields):
        raise ConfigurationError(f"changes='debezium': avro_schema's 'source' is no Debezium source block with a "
                                 f"position (PostgreSQL's 'lsn', MySQL's 'file' and 'pos'); {hint}")


def _avro_branch(kind: object, wanted: str) -> dict[str, object] | str | None:
    """The branch of an Avro type (a union: its non-null branch) that is a ``wanted`` type: a ``record``'s definition
    (or its name, when the schema refers to a record defined before), a primitive's name; None if there is none."""
    branches = kind if isinstance(kind, list) else [kind]
    for branch in branches:
        if isinstance(branch, dict) and branch.get("type") == wanted:
            return branch
        if branch == wanted or (wanted == "record" and isinstance(branch, str) and branch not in _AVRO_PRIMITIVES):
            return branch
    return None


_AVRO_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
