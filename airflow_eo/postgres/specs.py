"""The PostgreSQL sink kinds a DAG declares (validated at parse time, no I/O) and their factories.

Importing this module is cheap (no psycopg, no pyarrow): the factories import the adapters when a run builds one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_eo.core.config import TombstonePolicy, UpdateMode, table_sink_keys_and_updates, tombstone_policy
from airflow_eo.core.connections import Connections
from airflow_eo.core.drivers import require_driver
from airflow_eo.core.sinks import SinkAsset, SinkSpec, fencing_store, table_sink_options
from airflow_eo.postgres.sql import split_table, validate_identifier

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink


@dataclass(frozen=True)
class PostgresUpsertSink(SinkSpec):
    """``INSERT .. ON CONFLICT (keys) DO UPDATE SET c = EXCLUDED.c`` with overwrite semantics, replay-safe.

    Each Spark task ``COPY``s its rows into a session-private TEMP table, then writes them with one
    ``INSERT .. SELECT .. ON CONFLICT`` (of several rows of one key, the last in offset order wins) and commits; the
    store's commit point follows. A crash replays the batch and rewrites the same rows, so only overwriting updates
    are allowed (an accumulating ``add`` is refused here, at DAG parse time). With the offset store in the same
    database, every insert is fenced by the attempt's epoch.

    :param table: target table (``table`` or ``schema.table``, case-sensitive: quoted as given; a part holding a dot
        or a double quote double-quoted as in SQL, e.g. ``'"my.schema"."My ""T"" table"'``); must exist with a PRIMARY
        KEY / UNIQUE constraint on exactly ``key_columns``. Names are any 1 to 63 bytes without NUL.
    :param key_columns: the upsert key.
    :param conn_id: Airflow ``postgres`` connection of the target database.
    :param updates: per non-key column, ``"replace"`` (default, ``c = EXCLUDED.c``); the two-phase sink also allows
        ``"add"`` (``c = t.c + EXCLUDED.c``).
    :param dead_letter_table: where ``on_bad_record="dead_letter"`` writes bad records.
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
    conn_id: str = "postgres_default"
    updates: Mapping[str, UpdateMode | str] = field(default_factory=dict)
    dead_letter_table: str = "eo_dead_letter"
    on_tombstone: TombstonePolicy | str = TombstonePolicy.BAD_RECORD
    add_missing_columns: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_tombstone", tombstone_policy(
            self.name, self.on_tombstone, self.capabilities.deletes,
            "its rows may accumulate ('add' updates): a row is the sum of many records, not the one keyed record "
            "a tombstone deletes; use PostgresUpsertSink"))
        split_table(self.table)
        split_table(self.dead_letter_table)
        keys, updates = table_sink_keys_and_updates(self.name, self.key_columns, self.updates,
                                                    self.capabilities.accumulates, "PostgresTwoPhaseSink",
                                                    validate_identifier)
        object.__setattr__(self, "key_columns", keys)
        object.__setattr__(self, "updates", updates)

    @property
    def accumulating(self) -> bool:
        return any(m is UpdateMode.ADD for m in self.updates.values())

    @property
    def target(self) -> str:
        return self.table

    def asset(self, connections: Connections) -> SinkAsset:
        """``postgres://host:port/database/schema/table``, the scheme of Airflow's PostgreSQL provider."""
        require_driver('postgres')  # the connection module imports it
        from airflow_eo.postgres.connection import connect_kwargs

        db = connect_kwargs(connections.connection(self.conn_id))
        schema, table = split_table(self.table)
        return SinkAsset(f"postgres://{db['host']}:{db['port']}", f"{db['dbname']}.{schema or 'public'}.{table}")


@dataclass(frozen=True)
class PostgresTwoPhaseSink(PostgresUpsertSink):
    """Two-phase commit: each Spark task's transaction ends with ``PREPARE TRANSACTION``; ``COMMIT PREPARED`` only
    after the store's commit point. Nothing visible before it; all or nothing per batch.

    Allows accumulating updates, e.g. ``updates={"pv": "add"}`` → ``pv = t.pv + EXCLUDED.pv``. Needs
    ``max_prepared_transactions`` > 0 on the server (at least the pipeline's Spark write tasks + 1) and the ``CREATE``
    privilege on the table's schema (each task stages its rows in a table that lives only inside its transaction).
    """


def build_upsert(spec: PostgresUpsertSink, pipeline_id: str, connections: Connections,
                 offset_store_conn_id: str | None) -> Sink:
    from airflow_eo.postgres.connection import connect_kwargs
    from airflow_eo.postgres.sink import PostgresUpsertAdapter

    store = fencing_store(connections, offset_store_conn_id, "postgres")
    return PostgresUpsertAdapter(connect_kwargs(connections.connection(spec.conn_id)),
                                 store_kwargs=connect_kwargs(store) if store is not None else None,
                                 **table_sink_options(spec))


def build_two_phase(spec: PostgresTwoPhaseSink, pipeline_id: str, connections: Connections,
                    offset_store_conn_id: str | None) -> Sink:
    # Prepared transactions of an older attempt are never committed: no epoch fence needed.
    from airflow_eo.postgres.connection import connect_kwargs
    from airflow_eo.postgres.sink import PostgresTwoPhaseAdapter

    return PostgresTwoPhaseAdapter(connect_kwargs(connections.connection(spec.conn_id)), **table_sink_options(spec))
