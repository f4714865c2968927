"""The PostgreSQL sink kinds a DAG declares (validated at parse time, no I/O) and their factories.

Importing this module is cheap (no psycopg, no pyarrow): the factories import the adapters when a run builds one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_eo.core.sink_kinds import SinkAsset
from airflow_eo.postgres.sql import split_table, validate_identifier
from airflow_eo.sqlsink.specs import SqlTableSinkSpec, table_sink_factory


@dataclass(frozen=True)
class PostgresUpsertSink(SqlTableSinkSpec):
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
    :param on_tombstone: ``"bad_record"`` or ``"delete"`` (:class:`~airflow_eo.sqlsink.specs.SqlTableSinkSpec`).
    :param add_missing_columns: add an output column the table lacks, or fail naming it
        (:class:`~airflow_eo.sqlsink.specs.SqlTableSinkSpec`).
    """

    conn_id: str = "postgres_default"

    connect_kwargs_function: ClassVar[str] = "airflow_eo.postgres.connection:connect_kwargs"

    def __post_init__(self) -> None:
        self._check_table_sink("PostgresUpsertSink", "PostgresTwoPhaseSink", split_table, validate_identifier)

    def _asset(self, db: Mapping[str, Any]) -> SinkAsset:
        """``postgres://host:port/database/schema/table``, the scheme of Airflow's PostgreSQL provider."""
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


build_upsert = table_sink_factory("airflow_eo.postgres.sink:PostgresUpsertAdapter", fenced=True)
build_two_phase = table_sink_factory("airflow_eo.postgres.sink:PostgresTwoPhaseAdapter", fenced=False)
