"""The MySQL / MariaDB sink kinds a DAG declares (validated at parse time, no I/O) and their registration.

Importing this module is cheap (no pymysql, no pyarrow): the factories import the adapters when a run builds one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import quote_table
from airflow_eo.core.sink_kinds import SinkAsset
from airflow_eo.sqlsink.specs import SqlTableSinkSpec, table_sink_factory


@dataclass(frozen=True)
class MySqlUpsertSink(SqlTableSinkSpec):
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
    :param on_tombstone: ``"bad_record"`` or ``"delete"`` (:class:`~airflow_eo.sqlsink.specs.SqlTableSinkSpec`).
    :param add_missing_columns: add an output column the table lacks, or fail naming it
        (:class:`~airflow_eo.sqlsink.specs.SqlTableSinkSpec`).
    """

    conn_id: str = "mysql_default"
    rows_per_statement: int = 500
    bulk_load: bool = True

    connect_kwargs_function: ClassVar[str] = "airflow_eo.mysql.connection:connect_kwargs"

    def __post_init__(self) -> None:
        self._check_table_sink("MySqlUpsertSink", "MySqlXaSink", quote_table)
        if self.rows_per_statement < 1:
            raise ConfigurationError(f"{self.name}: rows_per_statement must be >= 1")

    def _asset(self, db: Mapping[str, Any]) -> SinkAsset:
        """``mysql://host:port/database/table``, the scheme of Airflow's MySQL provider."""
        database, _, table = self.table.rpartition(".")
        return SinkAsset(f"mysql://{db['host']}:{db['port']}", f"{database or db['database']}.{table}")

    def adapter_options(self) -> dict[str, Any]:
        return {**super().adapter_options(), "rows_per_statement": self.rows_per_statement,
                "bulk_load": self.bulk_load}


@dataclass(frozen=True)
class MySqlXaSink(MySqlUpsertSink):
    """XA two-phase commit: nothing visible until the store's commit point; all or nothing per batch.

    Allows accumulating updates, e.g. ``updates={"pv": "add"}`` → ``pv = pv + new.pv``.
    Needs MariaDB >= 10.5 or MySQL >= 5.7.7 (prepared branches survive disconnects) and,
    on MySQL 8, the ``XA_RECOVER_ADMIN`` privilege.
    """


build_upsert = table_sink_factory("airflow_eo.mysql.sink:MySqlUpsertAdapter", fenced=True)
build_xa = table_sink_factory("airflow_eo.mysql.sink:MySqlXaAdapter", fenced=False)
