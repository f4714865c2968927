"""The Apache Iceberg table sink kind a DAG declares (validated at parse time, no I/O) and its factory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_eo.core.config import TombstonePolicy, UpdateMode, lakehouse_keys_and_updates, tombstone_policy
from airflow_eo.core.connections import Connections
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_identifier
from airflow_eo.core.lineage_names import (
    CREDENTIALS_IN_LOCATION,
    LineageDataset,
    LineageSymlink,
    credentials_in,
    location_dataset,
    location_namespace,
)
from airflow_eo.core.sink_kinds import SinkAsset
from airflow_eo.lakehouse.specs import LakehouseTableSpec

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink

#: Iceberg's Spark runtime for Spark 4.0 / Scala 2.13, one shaded jar (its SHA-256 is pinned in ``spark/jars.py``).
ICEBERG_PACKAGE = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.0"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
#: PostgreSQL's JDBC driver, which Iceberg's JDBC catalog on PostgreSQL needs in the driver's JVM (pinned in
#: ``spark/jars.py``); here, not in catalog.py, so that a DAG file's import stays this module's.
POSTGRES_JDBC_PACKAGE = "org.postgresql:postgresql:42.7.8"


@dataclass(frozen=True)
class IcebergTableSink(LakehouseTableSpec):
    """Write the output into the Iceberg table ``catalog.namespace.table``; the table's own commit (one snapshot per
    batch) is the batch's commit point.

    Each snapshot the sink commits carries the batch's identity in its summary (``airflow-eo.pipeline``,
    ``airflow-eo.batch``, ``airflow-eo.app-id`` (one per data interval in interval mode), ``airflow-eo.ranges``).
    Iceberg has no idempotent write: every attempt first reads the table's snapshots (pyiceberg, on the driver) and
    writes nothing when its batch is there, rolling the offset store forward if the store did not know.

    :param table: ``catalog.namespace.table`` (a nested namespace: ``catalog.a.b.table``).
    :param warehouse: without ``catalog_conn_id``: the folder (or Hadoop file system URI) of a Hadoop catalog; the
        sink configures the Spark catalog named by ``table`` on it (``spark.sql.catalog.<catalog>`` = Iceberg's
        ``SparkCatalog``, ``type=hadoop``, ``warehouse``). With it: where the catalog puts the tables it creates (over
        the connection's extra ``warehouse``). More catalog settings (``io-impl``, credentials of the file system)
        go in the operator's ``spark_conf`` as ``spark.sql.catalog.<catalog>.<property>``.
    :param catalog_conn_id: an Airflow connection naming the catalog instead of a Hadoop folder
        (``airflow_eo/iceberg/catalog.py``): a ``postgres`` connection (Iceberg's JDBC catalog in that database), an
        ``iceberg`` connection (a REST catalog), or any connection whose extra holds the catalog's properties. The
        catalog is read on the driver by pyiceberg with the same properties; its secrets come only from here.
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
    catalog_conn_id: str = ""
    #: the sink's connection under the name every sink's has (``airflow eo --sink-conn-id`` replaces it): the catalog
    #: connection; empty for a Hadoop catalog (the file system's credentials are Spark's hadoop conf)
    conn_id: str = ""
    on_tombstone: TombstonePolicy | str = TombstonePolicy.BAD_RECORD

    def __post_init__(self) -> None:
        # conn_id wins: it is what the store recorded, or the connection `airflow eo` was told to use instead.
        object.__setattr__(self, "catalog_conn_id", self.conn_id or self.catalog_conn_id)
        object.__setattr__(self, "conn_id", self.catalog_conn_id)
        object.__setattr__(self, "on_tombstone", tombstone_policy(
            self.name, self.on_tombstone, self.capabilities.deletes, "the Iceberg sink does not delete rows"))
        parts = self.table.split(".") if isinstance(self.table, str) else []
        if len(parts) < 3:
            raise ConfigurationError(f"{self.name}: table must be 'catalog.namespace.table', not {self.table!r}")
        for part in parts:
            validate_identifier(part, "table name part")
        if not isinstance(self.warehouse, str) or any(c in self.warehouse for c in "\n\r\0") or \
                (not self.catalog_conn_id and not self.warehouse.strip()):
            raise ConfigurationError(
                f"{self.name}: give warehouse= (the folder or URI of a Hadoop catalog) or catalog_conn_id= (an Airflow "
                "connection naming the catalog). A catalog set up only in the operator's spark_conf is not enough: "
                "recovery and `airflow eo` read the table's snapshots through the catalog outside the Spark session")
        if credentials_in(self.warehouse):
            raise ConfigurationError(f"{self.name}: warehouse {CREDENTIALS_IN_LOCATION}")
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
        """The table's folder in the warehouse (a Hadoop catalog's layout, and where a JDBC or REST catalog puts a
        table it creates): ``<warehouse>/<namespace...>/<table>``; empty when the warehouse is the connection's."""
        return "/".join([self.warehouse.rstrip("/"), *self.table.split(".")[1:]]) if self.warehouse else ""

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
        warehouse = self.warehouse
        if self.catalog_conn_id and not warehouse:
            warehouse = str(connections.connection(self.catalog_conn_id).extra.get("warehouse", ""))
        if not warehouse:
            asset = self.asset(connections)
            return LineageDataset(asset.namespace, logical, storage_layer="iceberg")
        location = "/".join([warehouse.rstrip("/"), *logical.split(".")])
        return LineageDataset(*location_dataset(location), storage_layer="iceberg",
                              symlinks=(LineageSymlink(location_namespace(warehouse), logical),))

    def spark_connect_refusal(self) -> str | None:
        if not self.key_columns:
            return None  # an append is staged and cherry-picked in SQL
        return (f"{self.name}: MERGE (key_columns) cannot run over Spark Connect: its snapshot properties are "
                "given through Iceberg's CommitMetadata and its staged snapshot published by a compare-and-set of "
                "the table's metadata, both Java calls (py4j) a Connect client cannot make. Use a classic session "
                "(a spark connection, or local), or append (no key_columns)")

    def spark_conf(self) -> dict[str, str]:
        """Iceberg's runtime and SQL extension, and the catalog: a Hadoop catalog whole; a connection's catalog by its
        class only (its properties, secrets among them, are set on the running session by the adapter) and
        PostgreSQL's JDBC driver (a JDBC catalog's, which must be in the JVM from its start)."""
        prefix = f"spark.sql.catalog.{self.catalog}"
        conf = {"spark.jars.packages": ICEBERG_PACKAGE, "spark.sql.extensions": ICEBERG_EXTENSIONS,
                prefix: "org.apache.iceberg.spark.SparkCatalog"}
        if self.catalog_conn_id:
            return {**conf, "spark.jars.packages": f"{ICEBERG_PACKAGE},{POSTGRES_JDBC_PACKAGE}"}
        return {**conf, f"{prefix}.type": "hadoop", f"{prefix}.warehouse": self.warehouse}


def build(spec: IcebergTableSink, pipeline_id: str, connections: Connections,
          offset_store_conn_id: str | None) -> Sink:
    # The table's commit (a snapshot with the batch's identity) is the commit point: no store epoch fence needed.
    from airflow_eo.iceberg.catalog import catalog_properties
    from airflow_eo.iceberg.sink import IcebergTableAdapter

    catalog = catalog_properties(connections.connection(spec.catalog_conn_id), spec.warehouse) \
        if spec.catalog_conn_id else None
    return IcebergTableAdapter(pipeline_id, name=spec.name, table=spec.table, location=spec.location, catalog=catalog,
                               key_columns=spec.key_columns,
                               updates={c: UpdateMode(m).value for c, m in spec.updates.items()},
                               partition_by=spec.partition_by, extensions=ICEBERG_EXTENSIONS)
