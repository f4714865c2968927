"""What every SQL table sink's spec shares (parse time, no I/O, no driver): the checks of its options, the
``accumulating`` flag and the target, and the factory that builds its adapter when a run needs one."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.config import TombstonePolicy, UpdateMode, table_sink_keys_and_updates, tombstone_policy
from airflow_eo.core.connections import ConnectionInfo, Connections
from airflow_eo.core.drivers import require_driver
from airflow_eo.core.sink_kinds import SinkAsset, SinkSpec

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink


def _load(dotted: str) -> Any:
    """``module:name`` imported (the adapters and the driver load when a run needs them, not with a DAG file)."""
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def upsert_capabilities(connection_type: str) -> SinkCapabilities:
    """What every database's upsert kind can do (:class:`~airflow_eo.sqlsink.sink.SqlUpsertAdapter`): replay-safe
    writes, visible at once, fenced by the store's epoch where the store lives."""
    return SinkCapabilities(writes_visible_before_commit=True, interval_replay=True, deletes=True, dead_letters=True,
                            seen_ids=True, value_checks=True, refused_rows=True, applies_changes=True,
                            connection_type=connection_type)


def two_phase_capabilities(connection_type: str) -> SinkCapabilities:
    """What every database's two-phase kind can do (:class:`~airflow_eo.sqlsink.sink.SqlTwoPhaseAdapter`): prepared
    branches committed after the store's commit point, so its updates may add."""
    return SinkCapabilities(accumulates=True, in_doubt_branches=True, dead_letters=True, seen_ids=True,
                            value_checks=True, refused_rows=True, connection_type=connection_type)


def table_sink_options(spec: Any) -> dict[str, Any]:
    """What every database table sink's adapter takes from its spec (name, table, keys, updates as their values,
    dead-letter table, add_missing_columns); a kind adds its own options."""
    return {"name": spec.name, "table": spec.table, "key_columns": tuple(spec.key_columns),
            "updates": {c: UpdateMode(m).value for c, m in spec.updates.items()},
            "dead_letter_table": spec.dead_letter_table, "add_missing_columns": spec.add_missing_columns}


def fencing_store(connections: Connections, offset_store_conn_id: str | None, conn_type: str) -> ConnectionInfo | None:
    """The offset store's connection when it is a ``conn_type`` one: the epoch fence is a row of the store's own
    database, so only a store on the sink's kind of database can fence the sink's writes (None: no fence)."""
    store = connections.connection(offset_store_conn_id) if offset_store_conn_id else None
    return store if store is not None and store.conn_type == conn_type else None


@dataclass(frozen=True)
class SqlTableSinkSpec(SinkSpec):
    """The base of a database's two table sink specs: ``table`` and ``key_columns``, the options every database's
    spec has (keyword-only), and the checks. A database's spec (a frozen dataclass) declares its ``conn_id`` and its
    own options, names its kinds, its connection type and how it reads a table's name; its ``__post_init__`` calls
    :meth:`_check_table_sink`.

    :param updates: per non-key column, ``"replace"`` (default: the new value) or, for a two-phase kind only,
        ``"add"`` (the new value added to the stored one).
    :param dead_letter_table: where ``on_bad_record="dead_letter"`` writes bad records.
    :param on_tombstone: ``"bad_record"`` (default: a record with a null value is a bad record) or ``"delete"``:
        it deletes the row whose key columns its Kafka key gives (``key_format="string"`` for one key column,
        ``"json"``/``"avro"`` with ``key_schema`` naming them); of several events of one key in a batch the last
        in offset order wins, upsert or delete. Without a transform only.
    :param add_missing_columns: an output column the table lacks is added (nullable, its type mapped from Spark's)
        before the batch's write, idempotently; default False: the batch fails before any write, naming the column
        and the ``ALTER TABLE`` to run.
    """

    #: ``module:function`` turning the sink's connection into the driver's arguments
    connect_kwargs_function: ClassVar[str]

    #: the target table (each database validates its name: :meth:`_check_table_sink`)
    table: str
    #: the upsert key
    key_columns: Sequence[str]
    updates: Mapping[str, UpdateMode | str] = field(default_factory=dict, kw_only=True)
    dead_letter_table: str = field(default="eo_dead_letter", kw_only=True)
    on_tombstone: TombstonePolicy | str = field(default=TombstonePolicy.BAD_RECORD, kw_only=True)
    add_missing_columns: bool = field(default=False, kw_only=True)

    @property
    def conn_type(self) -> str:
        """The Airflow connection type of the sink's database (and of its driver)."""
        return self.capabilities.connection_type

    def _check_table_sink(self, upsert_kind: str, two_phase_kind: str, validate_table: Callable[[str], Any],
                          validate_identifier: Callable[[str, str], str] | None = None) -> None:
        """The options' checks, at parse time: tombstones, the tables' names, the keys and updates.

        :param upsert_kind: the database's kind that overwrites (offered when an accumulating sink is asked to
            delete).
        :param two_phase_kind: its kind that may accumulate (offered when ``add`` updates are asked of the upsert).
        """
        object.__setattr__(self, "on_tombstone", tombstone_policy(
            self.name, getattr(self, "on_tombstone"), self.capabilities.deletes,  # noqa: B009  (a subclass's field)
            "its rows may accumulate ('add' updates): a row is the sum of many records, not the one keyed record "
            f"a tombstone deletes; use {upsert_kind}"))
        validate_table(self.table)
        validate_table(getattr(self, "dead_letter_table"))  # noqa: B009  (a subclass's field)
        checks = (validate_identifier,) if validate_identifier is not None else ()
        keys, updates = table_sink_keys_and_updates(self.name, self.key_columns,
                                                    self.updates, self.capabilities.accumulates, two_phase_kind,
                                                    *checks)
        object.__setattr__(self, "key_columns", keys)
        object.__setattr__(self, "updates", updates)

    @property
    def row_key(self) -> tuple[str, ...]:
        return tuple(self.key_columns)

    @property
    def accumulating(self) -> bool:
        return any(m is UpdateMode.ADD for m in self.updates.values())

    @property
    def target(self) -> str:
        return self.table

    def asset(self, connections: Connections) -> SinkAsset:
        """The table as an Airflow asset, in the scheme of Airflow's provider of the database."""
        require_driver(self.conn_type)  # the connection module imports it
        db = _load(self.connect_kwargs_function)(connections.connection(self.conn_id))
        return self._asset(db)

    def _asset(self, db: Mapping[str, Any]) -> SinkAsset:
        raise NotImplementedError

    def adapter_options(self) -> dict[str, Any]:
        """What the adapter takes from the spec (a database adds its own options)."""
        return table_sink_options(self)


def table_sink_factory(adapter: str, *, fenced: bool) -> Callable[[Any, str, Connections, str | None], Sink]:
    """The factory :func:`~airflow_eo.core.sink_kinds.register_sink` takes for a SQL table sink kind.

    :param adapter: ``module:class`` of the adapter, imported when a run builds one.
    :param fenced: an upsert sink, given the offset store's connection when the store is on its kind of database
        (its writes are fenced by the store's epoch); a two-phase sink needs no fence: prepared branches of an older
        attempt are never committed.
    """
    def build(spec: SqlTableSinkSpec, pipeline_id: str, connections: Connections,
              offset_store_conn_id: str | None) -> Sink:
        connect_kwargs: Callable[[ConnectionInfo], dict[str, Any]] = _load(spec.connect_kwargs_function)
        options = spec.adapter_options()
        if fenced:
            store = fencing_store(connections, offset_store_conn_id, spec.conn_type)
            options["store_kwargs"] = connect_kwargs(store) if store is not None else None
        sink: Sink = _load(adapter)(connect_kwargs(connections.connection(spec.conn_id)), **options)
        return sink
    return build
