"""Sink kinds: what a DAG declares (a spec), what each kind can do (its capabilities) and how its run-time side
is built (its factory), registered once per kind (``docs/architecture.md``, "The sink registry").

A sink kind lives in its integration's folder (``airflow_eo/mysql``, ``airflow_eo/kafka``): a frozen spec class
(options only, checked when the DAG is parsed), an adapter implementing :class:`~airflow_eo.core.protocol.Sink`,
and one :func:`register_sink` call. Everything outside that folder (the operator, ``airflow eo``, the DAG tab, the
rewind rules) asks a kind's :class:`SinkCapabilities` and never compares class names. Plain Python: connections
reach a factory through the :class:`Connections` role, which the Airflow layer implements.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

from airflow_eo.core.config import SinkRecord, TombstonePolicy, UpdateMode
from airflow_eo.core.connections import ConnectionInfo, Connections
from airflow_eo.core.drivers import require_driver
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.lineage_names import LineageDataset
from airflow_eo.core.recovery import SinkRecovery
from airflow_eo.core.xid import Xid

if TYPE_CHECKING:
    from airflow_eo.core.batch import BatchContext, BatchRecord, DeadLetter
    from airflow_eo.core.protocol import Sink


log = logging.getLogger(__name__)
R = TypeVar("R")

@dataclass(frozen=True)
class SinkCapabilities:
    """What a sink kind can do; the questions the rest of airflow_eo asks instead of a class name."""

    #: its updates may add to a row or append (``add``, a Kafka topic): reprocessing offsets counts them twice
    accumulates: bool = False
    #: every write appends (a Kafka topic), rather than adding to a row's columns
    appends: bool = False
    #: it leaves prepared (in-doubt) branches (XA, ``PREPARE TRANSACTION``) that recovery resolves and status lists
    in_doubt_branches: bool = False
    #: it commits the consumed offsets to a Kafka consumer group in its own transaction (it owns the commit point)
    consumer_group: bool = False
    #: it writes bad records to a dead-letter table with the batch (``on_bad_record="dead_letter"``)
    dead_letters: bool = False
    #: it may run in interval mode, where cleared or backfilled intervals are replayed (overwriting updates only)
    interval_replay: bool = False
    #: it deletes rows for tombstones (``on_tombstone="delete"``)
    deletes: bool = False
    #: it keeps the event ids a batch saw in its database, committed with the output (``dedup_key``)
    seen_ids: bool = False
    #: its commit point is a table format's own commit (Delta, Iceberg), whose log records each batch: status reads
    #: it there
    table_commits: bool = False
    #: where its branches and dead letters live: the Airflow connection type of its ``conn_id`` (``airflow eo``
    #: may be given another connection of that type on the command line)
    connection_type: str = ""


@dataclass(frozen=True)
class SinkAsset:
    """Where a sink writes, in the URI scheme of Airflow's provider for that system (Assets, lineage)."""

    namespace: str  # e.g. mysql://host:port, kafka://bootstrap
    name: str  # e.g. database.table, topic

    @property
    def uri(self) -> str:
        return f"{self.namespace}/{self.name.replace('.', '/')}"


class SinkSpec(ABC):
    """Base of every sink spec: where output goes and how it becomes visible (options only, no I/O)."""

    conn_id: str
    #: the registered kind's name (what the offset store records); set by :func:`register_sink`
    kind: ClassVar[str] = ""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def capabilities(self) -> SinkCapabilities:
        return sink_kind(self.kind).capabilities

    @property
    def keeps_dead_letters(self) -> bool:
        return self.capabilities.dead_letters

    @property
    def keeps_seen_ids(self) -> bool:
        return self.capabilities.seen_ids

    @property
    def delete_keys(self) -> tuple[str, ...]:
        """The key columns a tombstone's row deletes by (``on_tombstone="delete"``); empty when tombstones are bad
        records."""
        if getattr(self, "on_tombstone", None) in ("delete", TombstonePolicy.DELETE):
            return tuple(getattr(self, "key_columns", ()))
        return ()

    @property
    def replay_safe(self) -> bool:
        """True when running a batch twice leaves the same result (interval-mode replays need it)."""
        return self.capabilities.interval_replay and not self.accumulating

    @property
    def accumulating(self) -> bool:
        """True when processing a record twice changes the result (adds to a row, appends): a rewind that
        reprocesses offsets counts them twice."""
        return self.capabilities.accumulates

    @property
    def target(self) -> str:
        """The table or topic written."""
        return ""

    def record(self) -> SinkRecord:
        """What the offset store records of this sink at each take (``airflow eo`` reads it)."""
        options = {f.name: _json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return SinkRecord(kind=self.kind, accumulating=self.accumulating, conn_id=self.conn_id, target=self.target,
                          dead_letter_table=options.get("dead_letter_table"),
                          options=options)

    @abstractmethod
    def asset(self, connections: Connections) -> SinkAsset:
        """The sink's Asset (each committed batch adds an event for it)."""

    def lineage(self, connections: Connections) -> LineageDataset:
        """The sink's output in OpenLineage's dataset naming: by default its Asset's namespace and name, which
        follow the spec for databases and topics; tables of files override it (``core/lineage_names.py``)."""
        asset = self.asset(connections)
        return LineageDataset(asset.namespace, asset.name)

    def spark_conf(self) -> dict[str, str]:
        """Spark conf the sink needs in the session that runs its batches (a table format's SQL extension and
        package); merged under the user's conf by :func:`with_sink_spark_conf`. Default: none."""
        return {}

    def spark_connect_refusal(self) -> str | None:
        """Why this sink cannot run its batches over Spark Connect (the operator refuses such a pipeline before any
        side effect); None: it can. Default: it can."""
        return None


class LakehouseTableSpec(SinkSpec):
    """A lakehouse table sink's spec (Delta, Iceberg): appends without ``key_columns``, else a ``MERGE`` whose
    ``updates`` replace or add; a batch is one table commit that names the batch, found again by a replay."""

    key_columns: Sequence[str]
    updates: Mapping[str, UpdateMode | str]

    @property
    def accumulating(self) -> bool:
        """Appends and ``add`` updates count reprocessed offsets twice (a rewind); a replay of the same batch is
        skipped by the table itself."""
        return not self.key_columns or any(m is UpdateMode.ADD for m in self.updates.values())

    @property
    def replay_safe(self) -> bool:
        # A cleared or backfilled interval replays its recorded batch: the table has that batch's commit under the
        # interval's identity, so nothing is written again, whatever the updates do.
        return True


#: Spark conf keys whose value is a comma-separated list: a sink's entries are added to the user's, not replaced.
SPARK_LIST_CONF = ("spark.sql.extensions", "spark.jars.packages", "spark.jars")


def with_sink_spark_conf(spec: SinkSpec, conf: Mapping[str, Any]) -> dict[str, Any]:
    """The user's Spark conf with what ``spec`` needs (:meth:`SinkSpec.spark_conf`): the user's value wins, except
    for list-valued keys (:data:`SPARK_LIST_CONF`), where the sink's entries missing from the user's are appended."""
    merged = {**spec.spark_conf(), **conf}
    for key, needed in spec.spark_conf().items():
        if key in SPARK_LIST_CONF and key in conf:
            given = [v.strip() for v in str(conf[key]).split(",") if v.strip()]
            merged[key] = ",".join([*given, *(v for v in needed.split(",") if v not in given)])
    return merged


#: Builds a kind's adapter: ``(spec, pipeline_id, connections, offset_store_conn_id) -> Sink``. The store's
#: connection is for sinks whose writes are fenced by its epochs (an upsert sink on the store's server).
SinkFactory = Callable[[Any, str, Connections, "str | None"], "Sink"]


def table_sink_options(spec: Any) -> dict[str, Any]:
    """What every database table sink's adapter takes from its spec (name, table, keys, updates as their values,
    dead-letter table, add_missing_columns); a kind adds its own options."""
    return {"name": spec.name, "table": spec.table, "key_columns": tuple(spec.key_columns),
            "updates": {c: UpdateMode(m).value for c, m in spec.updates.items()},
            "dead_letter_table": spec.dead_letter_table, "add_missing_columns": spec.add_missing_columns}


def no_dead_letters(name: str, records: Iterator[Any]) -> list[str]:
    """``write_dead_letters`` of a sink that keeps none: :func:`~airflow_eo.core.config.check_pipeline` refuses
    ``on_bad_record="dead_letter"`` with it when the DAG is parsed, so a bad record reaching it is an error (not an
    assert: ``python -O`` would drop the bad records silently)."""
    if next(records, None) is not None:
        raise ConfigurationError(f"{name} keeps no dead letters: on_bad_record='dead_letter' cannot run with it "
                                 "(the batch is not committed)")
    return []


def fencing_store(connections: Connections, offset_store_conn_id: str | None, conn_type: str) -> ConnectionInfo | None:
    """The offset store's connection when it is a ``conn_type`` one: the epoch fence is a row of the store's own
    database, so only a store on the sink's kind of database can fence the sink's writes (None: no fence)."""
    store = connections.connection(offset_store_conn_id) if offset_store_conn_id else None
    return store if store is not None and store.conn_type == conn_type else None


@dataclass(frozen=True)
class TableShape:
    """What a target table is made of, as its database reports it (read by the sink's check, before any write)."""

    #: every column the table stores that a write may set (generated columns are left out: the server computes them)
    columns: tuple[str, ...]
    #: the column sets of its PRIMARY KEY and UNIQUE indexes
    unique_keys: tuple[frozenset[str], ...]
    #: it has triggers (a replacing load deletes rows, which fires DELETE triggers an upsert never fires)
    has_triggers: bool = False
    #: another table's foreign key refers to it (a deleted row would cascade, or be refused)
    referenced: bool = False
    #: a plain base table (not a view, not system-versioned: those keep or change history rows differently)
    plain: bool = True


def why_replace_is_not_upsert(shape: TableShape, columns: Sequence[str], key_columns: Sequence[str],
                              updates: Mapping[str, str]) -> str | None:
    """None when replacing each written row whole (MySQL's ``LOAD DATA .. REPLACE``: a row of an existing key is
    deleted, the new one inserted) leaves the table exactly as the upsert (``INSERT .. ON DUPLICATE KEY UPDATE`` of
    every written column) does, for any rows and any table contents; else why not, for the log.

    It does when the updates only overwrite, the write sets every column the table stores (nothing the old row had
    survives an upsert either), the key is the table's only unique key (a replace deletes every row that conflicts
    on any unique key; an upsert updates one), and deleting a row has no side effect (no trigger, no foreign key
    referring to the table, no history). Column names compare as MySQL compares them: without case.
    """
    added = sorted(c for c, mode in updates.items() if UpdateMode(mode) is UpdateMode.ADD)
    if added:
        return f"its updates add to column(s) {', '.join(added)}"
    written = {c.lower() for c in columns}
    stored = {c.lower() for c in shape.columns}
    if written - stored:
        return f"the output has column(s) the table does not store: {', '.join(sorted(written - stored))}"
    if stored - written:
        return f"the output leaves column(s) {', '.join(sorted(stored - written))} out, which an upsert keeps"
    keys = {frozenset(c.lower() for c in key) for key in shape.unique_keys}
    if keys != {frozenset(c.lower() for c in key_columns)}:
        return "the table has another unique key besides the upsert key"
    if shape.has_triggers:
        return "the table has triggers"
    if shape.referenced:
        return "a foreign key refers to the table"
    if not shape.plain:
        return "the table is not a plain base table"
    return None


@dataclass(frozen=True)
class SinkKind:
    """One registered sink kind."""

    name: str
    spec: type[SinkSpec]
    capabilities: SinkCapabilities
    build: SinkFactory


_KINDS: dict[str, SinkKind] = {}


def register_sink(spec: type[SinkSpec], capabilities: SinkCapabilities, build: SinkFactory) -> SinkKind:
    """Register a sink kind under its spec's class name (what the offset store records); once per kind.

    Its factory first checks that the driver of its ``connection_type`` is installed
    (:func:`~airflow_eo.core.drivers.require_driver`: a clear error naming the extra to install).
    """
    name = spec.__name__
    known = _KINDS.get(name)
    if known is not None and known.spec is not spec:
        raise ConfigurationError(f"sink kind {name!r} is registered twice ({known.spec.__module__}, {spec.__module__})")
    kind = SinkKind(name, spec, capabilities, _with_driver(build, capabilities.connection_type))
    spec.kind = name
    _KINDS[name] = kind
    return kind


def _with_driver(build: SinkFactory, conn_type: str) -> SinkFactory:
    """``build``, after the check that ``conn_type``'s driver is installed."""

    def checked(spec: Any, pipeline_id: str, connections: Connections, store_conn_id: str | None) -> Sink:
        require_driver(conn_type)
        return build(spec, pipeline_id, connections, store_conn_id)

    return checked


def sink_kind(name: str) -> SinkKind:
    """The registered kind ``name``; a clear error when none is (a store written by a newer airflow_eo).

    The built-in kinds register when ``airflow_eo.sinks`` (which imports every integration's specs) is imported.
    """
    kind = _KINDS.get(name)
    if kind is None:
        raise ConfigurationError(f"sink kind {name!r} is not one airflow_eo can rebuild ({', '.join(sorted(_KINDS))}); "
                                 "its pipeline's next run recovers it")
    return kind


def sink_kinds() -> dict[str, SinkKind]:
    """Every registered kind, by name."""
    return dict(_KINDS)


def capabilities_of(record: SinkRecord | None) -> SinkCapabilities | None:
    """The capabilities of a recorded sink; None when the store recorded none or its kind is unknown here."""
    if record is None:
        return None
    try:
        return sink_kind(record.kind).capabilities
    except ConfigurationError:
        return None


def spec_from_record(record: SinkRecord, conn_id: str | None = None) -> SinkSpec:
    """The sink spec the store recorded (validated again), e.g. to run its adapter's recovery outside the DAG.

    :param record: what the store recorded at the pipeline's last take.
    :param conn_id: another connection of the same sink (default: the recorded one).
    """
    cls = sink_kind(record.kind).spec
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    options = {k: v for k, v in record.options.items() if k in names}
    if conn_id:
        options["conn_id"] = conn_id
    return cls(**options)


def _json_value(value: Any) -> Any:
    """A spec field as a JSON value (tuples as lists, enums as their values)."""
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


# --------------------------------------------------------------------------- what operations ask of an adapter
# ``airflow eo`` and the DAG tab ask a recorded sink's capabilities first, then use the matching role of its adapter
# (after an explicit check, never an ``assert``, which ``python -O`` removes: :func:`lacks_role`).


def lacks_role(kind: str, capability: str, role: type, adapter: object) -> ConfigurationError:
    """The error of a sink kind that declares ``capability`` while the adapter its factory built lacks the role
    that goes with it (``role``, one of the protocols below): the kind's registration and its adapter disagree.

    :param kind: the registered kind's name (what the store recorded).
    :param capability: the :class:`SinkCapabilities` field the kind declares.
    :param role: the protocol an adapter of such a kind implements.
    :param adapter: what the kind's factory built.
    """
    missing = sorted(name for name in vars(role) if not name.startswith("_") and not hasattr(adapter, name))
    lacking = f" (it has no {', '.join(missing)})" if missing else ""
    return ConfigurationError(
        f"sink kind {kind!r} declares the {capability!r} capability, but its adapter "
        f"{type(adapter).__module__}.{type(adapter).__qualname__} does not implement {role.__name__}{lacking}: "
        f"the kind's factory must build an adapter with that role, or its registration must not declare "
        f"{capability!r}")


@runtime_checkable
class InDoubtSink(Protocol):
    """A sink kind with ``in_doubt_branches``: lists the pipeline's prepared branches (read-only)."""

    def in_doubt(self, pipeline_id: str) -> list[Xid]: ...


@runtime_checkable
class ConsumerGroupSink(Protocol):
    """A sink kind with ``consumer_group``: the group's view of unfinished batches, and moving it (a rewind)."""

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]: ...
    def move_group_offsets(self, positions: Mapping[tuple[str, int], int]) -> None: ...
    def open_transactions(self) -> dict[tuple[str, int], tuple[int, int]]: ...


@runtime_checkable
class TableCommitSink(Protocol):
    """A sink kind with ``table_commits``: which unfinished batches the table committed, and a line on the table
    (its latest version, the pipeline's last batch in it) for ``airflow eo status``."""

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]: ...
    def table_state(self, pipeline_id: str) -> str: ...


class TableCommitAdapter(ABC):
    """The protocol steps shared by the table sinks whose format's own commit, made inside ``write``, is the commit
    point (Delta, Iceberg): recovery rolls forward the batches the table has; nothing to commit, finalize, hold or
    discard after ``write`` (a table commit is all or nothing); no dead letters."""

    owns_commit_point = True
    # The table commits inside write(), after the job that writes its files and only if every task of it succeeded: a
    # task that fails on a bad record commits nothing (no transform: one pass; with one: two, the first counting).
    writes_visible_before_commit = True
    commits_only_after_write_job = True
    name: str

    @abstractmethod
    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        """The unfinished batches the table committed but the store did not."""

    @property
    @abstractmethod
    def table_label(self) -> str:
        """The table, for messages (``the Delta table at /data/t``)."""

    #: a table commit's tries against other writers' conflicts, and the first wait between them (doubled each time)
    commit_tries: ClassVar[int] = 5
    commit_backoff_s: ClassVar[float] = 0.5

    def commit_with_retries(self, batch_id: int, commit: Callable[[], R],
                            conflict: Callable[[BaseException], str | None], committed: Callable[[], bool]) -> R | None:
        """``commit()`` the batch to the table, retrying when it conflicts with another writer of the table (a
        pipeline, a compaction job): ``conflict`` names what makes an error one (None: another error, raised).
        Before each retry the table is asked again: a batch it has now (``committed()``: a zombie's commit refused
        because a newer attempt made it) is not written again, and None is returned. Bounded: the last conflict is
        raised (the batch fails before its commit point)."""
        for attempt in range(1, self.commit_tries + 1):
            try:
                return commit()
            except Exception as exc:
                what = conflict(exc)
                if what is None:
                    raise
                log.warning("%s: %s refused the commit of batch %d: %s (%s)", self.name, self.table_label, batch_id,
                            what, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300])
                if committed():
                    return None
                if attempt == self.commit_tries:
                    raise
                wait = self.commit_backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)  # apart from the other
                log.warning("%s: batch %d is not in %s: a conflict with another writer; retrying in %.1f s (try %d "
                            "of %d)", self.name, batch_id, self.table_label, wait, attempt + 1, self.commit_tries)
                time.sleep(wait)
        raise AssertionError("unreachable: the last try returns or raises")

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        """Name the unfinished batches the table already committed."""
        if not unfinished:
            return SinkRecovery()
        committed = self.committed_batches(unfinished)
        for batch_id in sorted(committed):
            log.warning("%s: %s committed batch %d but the store did not record it; rolling forward", self.name,
                        self.table_label, batch_id)
        return SinkRecovery(committed=frozenset(committed))

    def commit(self, batch: BatchRecord) -> None:
        return None  # the table committed in write(); an empty batch wrote nothing: the store's commit is all

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        return None

    def can_hold_writes(self, out: Any) -> bool:
        return False

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        return no_dead_letters(self.name, records)

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        return None  # a table commit is all or nothing: an attempt that failed before it left nothing


def named_failure(exc: BaseException, names: re.Pattern[str]) -> str | None:
    """What in ``exc``'s text, its Python causes' or its Java cause chain (a classic Spark session's errors keep
    the Java exception; py4j and Spark Connect pass Java errors on as text) ``names`` matches; None: nothing."""
    parts: list[str] = []
    current: BaseException | None = exc
    depth = 0
    while current is not None and depth < 10:
        parts.append(f"{type(current).__name__}: {current}")
        origin = getattr(current, "_origin", None) or getattr(current, "java_exception", None)
        for _ in range(10):
            if origin is None:
                break
            try:
                parts.append(str(origin.toString()))
                origin = origin.getCause()
            except Exception:  # a gateway gone: the text so far is all there is
                break
        current, depth = current.__cause__ or current.__context__, depth + 1
    found = names.search("\n".join(parts))
    return found.group(0) if found else None


@runtime_checkable
class DeadLetterSink(Protocol):
    """A sink kind with ``dead_letters``: reads the pipeline's dead letters (oldest offsets first); None when its
    table does not exist yet."""

    def dead_letters(self, pipeline_id: str, batch_id: int | None, limit: int) -> list[dict[str, Any]] | None: ...
