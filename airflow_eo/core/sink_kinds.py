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
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.config import SinkRecord, TombstonePolicy
from airflow_eo.core.connections import Connections
from airflow_eo.core.drivers import require_driver
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.lineage_names import LineageDataset

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink

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

    @property
    def row_key(self) -> tuple[str, ...]:
        """The columns that name a row of the target (a table's ``key_columns``); empty: rows are appended."""
        return ()

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


#: Builds a kind's adapter: ``(spec, pipeline_id, connections, offset_store_conn_id) -> Sink``. The store's
#: connection is for sinks whose writes are fenced by its epochs (an upsert sink on the store's server).
SinkFactory = Callable[[Any, str, Connections, "str | None"], "Sink"]


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

    Its factory first checks that the driver it needs (``capabilities.required_driver``) is installed
    (:func:`~airflow_eo.core.drivers.require_driver`: a clear error naming the extra to install).
    """
    name = spec.__name__
    known = _KINDS.get(name)
    if known is not None and known.spec is not spec:
        raise ConfigurationError(f"sink kind {name!r} is registered twice ({known.spec.__module__}, {spec.__module__})")
    kind = SinkKind(name, spec, capabilities, _with_driver(build, capabilities.required_driver))
    spec.kind = name
    _KINDS[name] = kind
    return kind


def _with_driver(build: SinkFactory, driver: str) -> SinkFactory:
    """``build``, after the check that the registered ``driver`` is installed."""

    def checked(spec: Any, pipeline_id: str, connections: Connections, store_conn_id: str | None) -> Sink:
        require_driver(driver)
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
    try:
        return cls(**options)
    except TypeError as exc:  # a record written by a version whose spec had other required fields
        raise ConfigurationError(
            f"the store's record of this {record.kind} (options {sorted(record.options)}) does not make a "
            f"{record.kind} of this version: {exc}. A run of the pipeline's DAG records it again") from exc


def _json_value(value: Any) -> Any:
    """A spec field as a JSON value (tuples as lists, enums as their values)."""
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


class KindAdapter:
    """Base of a sink kind's adapter (the run-time side a factory builds): its capabilities are its kind's, as
    registered under its ``name`` (the spec's class name), never declared again on the adapter."""

    name: str

    @property
    def capabilities(self) -> SinkCapabilities:
        return sink_kind(self.name).capabilities

    def close(self) -> None:
        """Nothing kept open between calls (an adapter that keeps connections closes them)."""
        return None
