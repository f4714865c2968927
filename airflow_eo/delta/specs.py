"""The Delta Lake table sink kind a DAG declares (validated at parse time, no I/O) and its factory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_eo.core.config import TombstonePolicy, UpdateMode, lakehouse_keys_and_updates, tombstone_policy
from airflow_eo.core.connections import Connections
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_identifier
from airflow_eo.core.lineage_names import CREDENTIALS_IN_LOCATION, LineageDataset, credentials_in, location_dataset
from airflow_eo.core.sink_kinds import SinkAsset
from airflow_eo.lakehouse.specs import LakehouseTableSpec

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink

#: Delta Lake's Spark package for Spark 4.0 / Scala 2.13 (its jars' SHA-256 are pinned in ``spark/jars.py``).
DELTA_PACKAGE = "io.delta:delta-spark_2.13:4.0.0"
DELTA_SPARK_CONF = {
    "spark.jars.packages": DELTA_PACKAGE,
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


@dataclass(frozen=True)
class DeltaTableSink(LakehouseTableSpec):
    """Write the output into a Delta Lake table at ``path``; the table's own commit is the batch's commit point.

    Each batch is one Delta commit carrying ``txnAppId`` / ``txnVersion`` (app id ``airflow_eo.<pipeline_id>``, one
    per data interval in interval mode; version = batch id) and the batch's offset ranges as the commit's
    ``userMetadata``. Delta skips a write whose version it already has for the app id; every attempt first asks the
    table whether its batch committed and rolls the offset store forward if so.

    :param path: the table's location (a local folder or a Hadoop file system URI); created from the output's
        schema when no table is there. Required, also with ``table``: recovery and ``airflow eo`` read the table's
        log there with delta-rs, outside any Spark session.
    :param table: also a name for the table (``db.table`` or ``catalog.db.table``) in the catalog the operator's
        ``spark_conf`` configures (a Hive metastore, ...): the sink registers ``path`` under it (an external table)
        before the batch's commit and refuses a name registered at another location. Spark's default in-memory
        catalog forgets it when the task's process ends, so the sink refuses that catalog.
    :param key_columns: none: append every row; else ``MERGE`` on these columns (of several rows of one key in a
        batch, the last in offset order wins).
    :param updates: with ``key_columns``, per non-key column ``"replace"`` (default) or ``"add"``
        (``t.c + s.c``: the commit is atomic and happens once, so adding is exactly-once too).
    :param partition_by: partition columns of a table created here.
    :param on_tombstone: ``"bad_record"`` only.
    """

    path: str = ""
    key_columns: Sequence[str] = ()
    updates: Mapping[str, UpdateMode | str] = field(default_factory=dict)
    partition_by: Sequence[str] = ()
    conn_id: str = ""  # no Airflow connection: the file system's credentials are Spark's (hadoop conf)
    on_tombstone: TombstonePolicy | str = TombstonePolicy.BAD_RECORD
    table: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_tombstone", tombstone_policy(
            self.name, self.on_tombstone, self.capabilities.deletes, "the Delta sink does not delete rows"))
        if not isinstance(self.table, str) or (self.table and not 1 <= self.table.count(".") <= 2):
            raise ConfigurationError(f"{self.name}: table must be 'db.table' or 'catalog.db.table', not "
                                     f"{self.table!r}")
        for part in self.table.split(".") if self.table else ():
            validate_identifier(part, "table name part")
        if self.table and not (isinstance(self.path, str) and self.path.strip()):
            raise ConfigurationError(
                f"{self.name}: table= needs path= too (where the table's files are): recovery and `airflow eo` read "
                "the table's log by its location outside any Spark session, and a managed table's location is "
                "known only to the catalog's Spark session; the sink registers path under the name")
        if not isinstance(self.path, str) or not self.path.strip() or any(c in self.path for c in "\n\r\0"):
            raise ConfigurationError(f"{self.name}: path must name the table's folder or URI")
        if credentials_in(self.path):
            raise ConfigurationError(f"{self.name}: path {CREDENTIALS_IN_LOCATION}")
        keys, updates = lakehouse_keys_and_updates(self.name, self.key_columns, self.updates)
        object.__setattr__(self, "key_columns", keys)
        object.__setattr__(self, "updates", updates)
        object.__setattr__(self, "partition_by",
                           tuple(validate_identifier(c, "partition column") for c in self.partition_by))

    @property
    def target(self) -> str:
        return self.path

    def asset(self, connections: Connections) -> SinkAsset:
        """``file:///folder`` for a local folder, else the path's own URI (``s3a://bucket/...``)."""
        scheme, sep, rest = self.path.partition("://")
        if sep:
            return TableLocation(f"{scheme}://", rest)
        return TableLocation("file://", self.path)

    def lineage(self, connections: Connections) -> LineageDataset:
        """The table's location in OpenLineage's naming (``file`` + the absolute path, ``s3://bucket`` + the key),
        as OpenLineage's Spark integration names a Delta table at a path."""
        return LineageDataset(*location_dataset(self.path), storage_layer="delta")

    def spark_conf(self) -> dict[str, str]:
        return dict(DELTA_SPARK_CONF)


@dataclass(frozen=True)
class TableLocation(SinkAsset):
    """A table's location as its Asset: the URI is the location itself (its dots are not separators)."""

    @property
    def uri(self) -> str:
        return f"{self.namespace}{self.name}"


def build(spec: DeltaTableSink, pipeline_id: str, connections: Connections, offset_store_conn_id: str | None) -> Sink:
    # Delta's own commit (its txnAppId/txnVersion) is the commit point: no store epoch fence needed.
    from airflow_eo.delta.sink import DeltaTableAdapter

    return DeltaTableAdapter(pipeline_id, name=spec.name, path=spec.path, table=spec.table,
                             key_columns=spec.key_columns,
                             updates={c: UpdateMode(m).value for c, m in spec.updates.items()},
                             partition_by=spec.partition_by)
