"""The Apache Iceberg table sink kind a DAG declares (validated at parse time, no I/O) and its factory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_eo.core.config import TombstonePolicy, UpdateMode, lakehouse_keys_and_updates, tombstone_policy
from airflow_eo.core.connections import Connections
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_identifier
from airflow_eo.core.lineage_names import LineageDataset, LineageSymlink, location_dataset, location_namespace
from airflow_eo.core.sinks import LakehouseTableSpec, SinkAsset

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink

#: Iceberg's Spark runtime for Spark 4.0 / Scala 2.13, one shaded jar (its SHA-256 is pinned in ``spark/session.py``).
ICEBERG_PACKAGE = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


@dataclass(frozen=True)
class IcebergTableSink(LakehouseTableSpec):
    """Write the output into the Iceberg table ``catalog.namespace.table``; the table's own commit (one snapshot per
    batch) is the batch's commit point.

    Each snapshot the sink commits carries the batch's identity in its summary (``airflow-eo.pipeline``,
    ``airflow-eo.batch``, ``airflow-eo.app-id`` (one per data interval in interval mode), ``airflow-eo.ranges``).
    Iceberg has no idempotent write: every attempt first reads the table's snapshots (pyiceberg, on the driver) and
    writes nothing when its batch is there, rolling the offset store forward if the store did not know.

    :param table: ``catalog.namespace.table`` (a nested namespace: ``catalog.a.b.table``).
    :param warehouse: the folder (or Hadoop file system URI) of a Hadoop catalog; the sink configures the Spark
        catalog named by ``table`` on it (``spark.sql.catalog.<catalog>`` = Iceberg's ``SparkCatalog``, ``type=hadoop``,
        ``warehouse``). More catalog settings (``io-impl``, credentials) go in the operator's ``spark_conf`` as
        ``spark.sql.catalog.<catalog>.<property>``.
    :param key_columns: none: append every row; else ``MERGE INTO`` on these columns (of several rows of one key in
        a batch, the last in offset order wins).
    :param updates: with ``key_columns``, per non-key column ``"replace"`` (default) or ``"add"`` (``t.c + s.c``:
        the commit is atomic and happens once, so adding is exactly-once too).
    :param partition_by: identity partition columns of a table created here.
    :param on_tombstone: ``"bad_record"`` only.
    """

    table: str
    warehouse: str = ""
    key_columns: Sequence[str] = ()
    updates: Mapping[str, UpdateMode | str] = field(default_factory=dict)
    partition_by: Sequence[str] = ()
    conn_id: str = ""  # no Airflow connection: the file system's credentials are Spark's (hadoop conf)
    on_tombstone: TombstonePolicy | str = TombstonePolicy.BAD_RECORD

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_tombstone", tombstone_policy(
            self.name, self.on_tombstone, self.capabilities.deletes, "the Iceberg sink does not delete rows"))
        parts = self.table.split(".") if isinstance(self.table, str) else []
        if len(parts) < 3:
            raise ConfigurationError(f"{self.name}: table must be 'catalog.namespace.table', not {self.table!r}")
        for part in parts:
            validate_identifier(part, "table name part")
        if not isinstance(self.warehouse, str) or not self.warehouse.strip() or \
                any(c in self.warehouse for c in "\n\r\0"):
            raise ConfigurationError(f"{self.name}: warehouse must name the Hadoop catalog's folder or URI")
        keys, updates = lakehouse_keys_and_updates(self.name, self.key_columns, self.updates)
        object.__setattr__(self, "key_columns", keys)
        object.__setattr__(self, "updates", updates)
        object.__setattr__(self, "partition_by",
                           tuple(validate_identifier(c, "partition column") for c in self.partition_by))

    @property
    def catalog(self) -> str:
        return self.table.split(".")[0]

    @property
    def location(self) -> str:
        """The table's folder in the Hadoop catalog: ``<warehouse>/<namespace...>/<table>``."""
        return "/".join([self.warehouse.rstrip("/"), *self.table.split(".")[1:]])

    @property
    def target(self) -> str:
        return self.table

    def asset(self, connections: Connections) -> SinkAsset:
        """``iceberg://<catalog>/<namespace>/<table>``: the table as the DAG names it."""
        catalog, _, rest = self.table.partition(".")
        return SinkAsset(f"iceberg://{catalog}", rest)

    def lineage(self, connections: Connections) -> LineageDataset:
        """The table's location in OpenLineage's naming (``file`` + ``<warehouse>/<namespace>/<table>``), and its
        name in the Hadoop catalog as a ``TABLE`` symlink (namespace the warehouse, name ``namespace.table``), as
        OpenLineage's Spark integration names an Iceberg table of a Hadoop catalog. The Asset keeps the catalog's
        name (``iceberg://<catalog>/...``), which is how a DAG names the table."""
        logical = self.table.partition(".")[2]
        return LineageDataset(*location_dataset(self.location), storage_layer="iceberg",
                              symlinks=(LineageSymlink(location_namespace(self.warehouse), logical),))

    def spark_conf(self) -> dict[str, str]:
        prefix = f"spark.sql.catalog.{self.catalog}"
        return {"spark.jars.packages": ICEBERG_PACKAGE, "spark.sql.extensions": ICEBERG_EXTENSIONS,
                prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "hadoop",
                f"{prefix}.warehouse": self.warehouse}


def build(spec: IcebergTableSink, pipeline_id: str, connections: Connections,
          offset_store_conn_id: str | None) -> Sink:
    # The table's commit (a snapshot with the batch's identity) is the commit point: no store epoch fence needed.
    from airflow_eo.iceberg.sink import IcebergTableAdapter

    return IcebergTableAdapter(pipeline_id, name=spec.name, table=spec.table, location=spec.location,
                               key_columns=spec.key_columns,
                               updates={c: UpdateMode(m).value for c, m in spec.updates.items()},
                               partition_by=spec.partition_by, extensions=ICEBERG_EXTENSIONS)
