"""The MySQL / MariaDB sink kinds a DAG declares (validated at parse time, no I/O) and their registration.

Importing this module is cheap (no pymysql, no pyarrow): the factories import the adapters when a run builds one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_eo.core.config import TombstonePolicy, UpdateMode, table_sink_keys_and_updates, tombstone_policy
from airflow_eo.core.connections import Connections
from airflow_eo.core.drivers import require_driver
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import quote_table
from airflow_eo.core.sinks import SinkAsset, SinkSpec, fencing_store, table_sink_options

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink


@dataclass(frozen=True)
class MySqlUpsertSink(SinkSpec):
    """``INSERT .. ON DUPLICATE KEY UPDATE`` with overwrite semantics, replay-safe.

    Each Spark task commits its own statements; the store's commit point follows. A
    crash replays the batch and rewrites the same rows, so only overwriting updates
    are allowed (an accumulating ``add`` is refused here, at DAG parse time).

    :param table: target table (``table`` or ``database.table``); must exist with a
        PRIMARY KEY / UNIQUE index on exactly ``key_columns``.
    :param key_columns: the upsert key.
    :param conn_id: Airflow ``mysql`` connection of the target database.
    :param updates: per non-key column, ``"replace"`` (default, ``c = new c``); the XA sink also
        allows ``"add"`` (``c = c + new c``).
    :param rows_per_statement: rows per multi-row INSERT.
    :param dead_letter_table: where ``on_bad_record="dead_letter"`` writes bad records.
    :param bulk_load: each Spark task loads its rows with ``LOAD DATA LOCAL INFILE`` (CSV files written by Arrow)
        into a session-private staging table, then writes them with one ``INSERT .. SELECT .. ON DUPLICATE KEY
        UPDATE``: the same rows and updates as the multi-row statements, several times faster. Used when the server
        allows it (``local_infile=ON``, MariaDB's default) and for columns of plain types; otherwise the
        statements. The server may read only the staging file being loaded at that moment (any other file it asks
        for is refused and fails the task); False: the writer's connections do not offer ``LOAD DATA LOCAL``.
    :param on_tombstone: ``"bad_record"`` (default: a record with a null value is a bad record) or ``"delete"``:
        it deletes the row whose key columns its Kafka key gives (``key_format="string"`` for one key column,
        ``"json"``/``"avro"`` with ``key_schema`` naming them); of several events of one key in a batch the last
        in offset order wins, upsert or delete. Without a transform only.
    :param add_missing_columns: an output column the table lacks is added (nullable, its type mapped from Spark's)
        before the batch's write, idempotently; default False: the batch fails before any write, naming the column
        and the ``ALTER TABLE`` to run.
    """

    table: str
    key_columns: Sequence[str]
    conn_id: str = "mysql_default"
    updates: Mapping[str, UpdateMode | str] = field(default_factory=dict)
    rows_per_statement: int = 500
    dead_letter_table: str = "eo_dead_letter"
    bulk_load: bool = True
    on_tombstone: TombstonePolicy | str = TombstonePolicy.BAD_RECORD
    add_missing_columns: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_tombstone", tombstone_policy(
            self.name, self.on_tombstone, self.capabilities.deletes,
            "its rows may accumulate ('add' updates): a row is the sum of many records, not the one keyed record "
            "a tombstone deletes; use MySqlUpsertSink"))
        quote_table(self.table)
        quote_table(self.dead_letter_table)
        keys, updates = table_sink_keys_and_updates(self.name, self.key_columns, self.updates,
                                                    self.capabilities.accumulates, "MySqlXaSink")
        object.__setattr__(self, "key_columns", keys)
        object.__setattr__(self, "updates", updates)
        if self.rows_per_statement < 1:
            raise ConfigurationError(f"{self.name}: rows_per_statement must be >= 1")

    @property
    def accumulating(self) -> bool:
        return any(m is UpdateMode.ADD for m in self.updates.values())

    @property
    def target(self) -> str:
        return self.table

    def asset(self, connections: Connections) -> SinkAsset:
        """``mysql://host:port/database/table``, the scheme of Airflow's MySQL provider."""
        require_driver('mysql')  # the connection module imports it
        from airflow_eo.mysql.connection import connect_kwargs

        db = connect_kwargs(connections.connection(self.conn_id))
        database, _, table = self.table.rpartition(".")
        return SinkAsset(f"mysql://{db['host']}:{db['port']}", f"{database or db['database']}.{table}")


@dataclass(frozen=True)
class MySqlXaSink(MySqlUpsertSink):
    """XA two-phase commit: nothing visible until the store's commit point; all or nothing per batch.

    Allows accumulating updates, e.g. ``updates={"pv": "add"}`` → ``pv = pv + new.pv``.
    Needs MariaDB >= 10.5 or MySQL >= 5.7.7 (prepared branches survive disconnects) and,
    on MySQL 8, the ``XA_RECOVER_ADMIN`` privilege.
    """


def _options(spec: MySqlUpsertSink) -> dict[str, Any]:
    return {**table_sink_options(spec), "rows_per_statement": spec.rows_per_statement, "bulk_load": spec.bulk_load}


def build_upsert(spec: MySqlUpsertSink, pipeline_id: str, connections: Connections,
                  offset_store_conn_id: str | None) -> Sink:
    from airflow_eo.mysql.connection import connect_kwargs
    from airflow_eo.mysql.sink import MySqlUpsertAdapter

    store = fencing_store(connections, offset_store_conn_id, "mysql")
    return MySqlUpsertAdapter(connect_kwargs(connections.connection(spec.conn_id)),
                              store_kwargs=connect_kwargs(store) if store is not None else None, **_options(spec))


def build_xa(spec: MySqlXaSink, pipeline_id: str, connections: Connections,
              offset_store_conn_id: str | None) -> Sink:
    # Prepared branches of an older attempt are never committed: no epoch fence needed.
    from airflow_eo.mysql.connection import connect_kwargs
    from airflow_eo.mysql.sink import MySqlXaAdapter

    return MySqlXaAdapter(connect_kwargs(connections.connection(spec.conn_id)), **_options(spec))
