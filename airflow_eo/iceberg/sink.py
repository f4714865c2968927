"""Apache Iceberg table sink (``docs/architecture.md``, "Sinks"): the table's commit is the commit point.

A batch is one Iceberg snapshot: an append (``DataFrameWriterV2`` with ``snapshot-property.*`` write options) or a
``MERGE INTO`` (its snapshot properties through Iceberg's ``CommitMetadata.withCommitProperties``, which holds them
for the Java thread that runs the MERGE). Each snapshot's summary names the pipeline, the batch, its app id (one per
data interval in interval mode) and its offset ranges. Iceberg has no idempotent write (apache/iceberg#8809), so the
sink asks first: every attempt reads the table's snapshots (pyiceberg on the driver, without Spark) and writes
nothing when the current snapshot's ancestry already holds the batch; the offset store mirrors the commit afterwards
and recovery rolls it forward when the table has a batch the store does not
(:func:`~airflow_eo.core.recovery.committed_by_table`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_eo.core.batch import BatchContext, BatchRecord, WritePlan, WriteResult
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.recovery import TableTransaction, committed_by_table, table_transaction
from airflow_eo.core.sinks import TableCommitAdapter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: the snapshot summary properties of a batch (``<table>.snapshots``' ``summary`` column shows them)
PIPELINE, BATCH, APP_ID, INTERVAL, RANGES = (f"airflow-eo.{k}" for k in ("pipeline", "batch", "app-id", "interval",
                                                                         "ranges"))
_ORDER = "_eo_order"


class IcebergTableAdapter(TableCommitAdapter):
    """The run-time side of :class:`~airflow_eo.iceberg.specs.IcebergTableSink` (a ``core.protocol.Sink``).

    :param pipeline_id: the pipeline whose batches these are.
    :param name: the sink kind's name, for messages.
    :param table: ``catalog.namespace.table``, as Spark names it.
    :param location: the table's folder (a Hadoop catalog's layout), where pyiceberg reads its metadata.
    :param key_columns: empty: append; else the MERGE key.
    :param updates: ``replace`` / ``add`` per non-key column (MERGE only).
    :param partition_by: identity partition columns of a table created here.
    :param extensions: the SQL extensions class the session must run with (MERGE, the table's creation).
    """

    def __init__(self, pipeline_id: str, *, name: str, table: str, location: str, key_columns: Sequence[str] = (),
                 updates: Mapping[str, str] | None = None, partition_by: Sequence[str] = (),
                 extensions: str = "") -> None:
        self.pipeline_id, self.name, self.table, self.location = pipeline_id, name, table, location
        self.key_columns = tuple(key_columns)
        self.updates = dict(updates or {})
        self.partition_by = tuple(partition_by)
        self.extensions = extensions
        #: the snapshot the last write of this adapter committed (None: skipped, or nothing written)
        self.last_snapshot_id: int | None = None

    # ------------------------------------------------------------------ the table's snapshots

    def check(self) -> None:
        try:
            __import__("pyiceberg")
        except ImportError:
            raise ConfigurationError(f"{self.name} needs pyiceberg (reads the table's snapshots on the driver): "
                                     "pip install 'airflow-eo[iceberg]'") from None

    def metadata(self) -> Any:
        """The table's metadata as pyiceberg reads it from the catalog's folder (its ``version-hint.text``); None:
        no table yet."""
        from pyiceberg.table import StaticTable

        try:
            return StaticTable.from_metadata(self.location).metadata
        except FileNotFoundError:
            return None

    def batch_snapshots(self, metadata: Any = None) -> list[tuple[int, dict[str, str]]]:
        """``(snapshot id, summary)`` of the current snapshot and its ancestors that carry an airflow_eo batch,
        newest first (a rolled-back snapshot is not the table's any more); empty when there is no table yet."""
        from pyiceberg.table.snapshots import ancestors_of

        metadata = metadata or self.metadata()
        if metadata is None:
            return []
        found = []
        for snapshot in ancestors_of(metadata.current_snapshot(), metadata):
            summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
            if BATCH in summary:
                found.append((snapshot.snapshot_id, summary))
        return found

    @property
    def table_label(self) -> str:
        return f"the Iceberg table {self.table}"

    def committed_versions(self) -> dict[str, int]:
        """The highest batch id the table holds per app id."""
        versions: dict[str, int] = {}
        for _, summary in self.batch_snapshots():
            app_id, batch_id = summary.get(APP_ID, ""), int(summary[BATCH])
            versions[app_id] = max(batch_id, versions.get(app_id, batch_id))
        return versions

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        """The unfinished batches the table committed (a snapshot of their app id reached them) but the store
        did not."""
        return committed_by_table(unfinished, self.committed_versions())

    def table_state(self, pipeline_id: str) -> str:
        """The table's current snapshot and the pipeline's newest batch in it (``airflow eo status``)."""
        metadata = self.metadata()
        if metadata is None:
            return (f"Iceberg table {self.table}: not created yet (the pipeline's first batch with output creates "
                    "it)")
        for snapshot_id, summary in self.batch_snapshots(metadata):
            if summary.get(PIPELINE) == pipeline_id:
                return (f"Iceberg table {self.table}: snapshot {metadata.current_snapshot_id}; this pipeline's last "
                        f"batch in it: batch {summary[BATCH]} at snapshot {snapshot_id}")
        return (f"Iceberg table {self.table}: snapshot {metadata.current_snapshot_id}; no batch of this pipeline in "
                "its current snapshot's history")

    # ------------------------------------------------------------------ protocol steps

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """THE commit point: the batch's output as one Iceberg snapshot carrying the batch's identity.

        Asks the table first: a batch it already has (a retry after a crash past the table commit, a replayed
        interval) is not written again.
        """
        out: DataFrame = plan.output
        spark = out.sparkSession
        _require_iceberg_session(spark, self.name, self.table, self.extensions)
        txn = table_transaction(batch.pipeline_id, batch.batch_id, batch.interval)
        done = self.committed_versions().get(txn.app_id)
        if done is not None and done >= txn.version:
            log.info("%s: the Iceberg table %s already has batch %d (%s at batch %d); not writing it again",
                     self.name, self.table, batch.batch_id, txn.app_id, done)
            self.last_snapshot_id = None
            return WriteResult([], 0)
        missing = [c for c in (*self.key_columns, *self.updates, *self.partition_by) if c not in out.columns]
        if missing:
            raise ConfigurationError(f"{self.name}: the transform's output lacks column(s) {', '.join(missing)}; "
                                     f"it has {', '.join(out.columns)}")
        self._create(spark, out)
        properties = snapshot_properties(batch, txn)
        merged = 0
        if self.key_columns:
            # Materialized: MERGE INTO refuses a source whose plan is not deterministic (the offset-order id).
            source = self._merge_source(out).localCheckpoint(eager=True)
            merged = source.count()  # one row per key: each updates or inserts one row of the table
            failpoint("before_table_commit")
            self._merge(spark, source, properties)
        else:
            failpoint("before_table_commit")
            writer = out.writeTo(_quote_table(self.table))
            for key, value in properties.items():
                writer = writer.option(f"snapshot-property.{key}", value)
            writer.append()
        failpoint("after_table_commit")
        # The batch's own snapshot (found by its identity: another writer may have committed since).
        self.last_snapshot_id, summary = next(
            ((s, summary) for s, summary in self.batch_snapshots()
             if summary.get(APP_ID) == txn.app_id and summary[BATCH] == str(txn.version)), (None, {}))
        # An append's count from its snapshot: no second pass over the output.
        rows = merged if self.key_columns else int(summary.get("added-records", 0))
        log.info("%s: committed batch %d as snapshot %s of the Iceberg table %s", self.name, batch.batch_id,
                 self.last_snapshot_id, self.table)
        return WriteResult([], rows)

    def _create(self, spark: SparkSession, out: DataFrame) -> None:
        """The table from the output's schema when missing (``IF NOT EXISTS``: a concurrent attempt may have created
        it since). Its own commit, without a snapshot: an empty table has none."""
        if self.metadata() is not None:
            return
        columns = ", ".join(f"{_quote(f.name)} {f.dataType.simpleString()}" for f in out.schema.fields)
        partitioned = f" PARTITIONED BY ({', '.join(map(_quote, self.partition_by))})" if self.partition_by else ""
        namespace = _quote_table(self.table.rsplit(".", 1)[0])
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {_quote_table(self.table)} ({columns}) USING iceberg{partitioned}")
        log.info("%s: created the Iceberg table %s from the output's schema", self.name, self.table)

    def _merge_source(self, out: DataFrame) -> DataFrame:
        """One row per key: of several rows of one key the last in offset order wins, ``add`` columns add up every
        row's value (MERGE refuses a source with two rows for one target row)."""
        from pyspark.sql import functions as F

        # The output's rows come in offset order within each Spark partition (one Kafka partition's range): the
        # increasing id keeps that order through the shuffle of the aggregation.
        ordered = out.withColumn(_ORDER, F.monotonically_increasing_id())
        added = [c for c in out.columns if self.updates.get(c) == "add"]
        kept = [c for c in out.columns if c not in self.key_columns and c not in added]
        aggregates = [F.max_by(F.struct(*[F.col(c) for c in kept]), F.col(_ORDER)).alias("_eo_last")] if kept else []
        aggregates += [F.sum(F.col(c)).cast(out.schema[c].dataType).alias(c) for c in added]
        source = ordered.groupBy(*self.key_columns).agg(*aggregates)
        return source.select(*self.key_columns, *[F.col(f"_eo_last.{c}").alias(c) for c in kept], *added)

    def _merge(self, spark: SparkSession, source: DataFrame, properties: Mapping[str, str]) -> None:
        """``MERGE INTO`` the table, its snapshot carrying ``properties``: Iceberg takes them from
        ``CommitMetadata.withCommitProperties``, a thread-local of the JVM thread that runs the callable. The MERGE
        runs inside it as a Python callback: pyspark's pinned-thread gateway runs a callback's calls back into the
        JVM on the thread that called it."""
        from pyspark.java_gateway import ensure_callback_server_started

        if getattr(spark, "_jvm", None) is None:
            raise ConfigurationError(f"{self.name}: MERGE with snapshot properties needs a classic Spark session "
                                     "(py4j); over Spark Connect use the sink without key_columns (append)")
        view = f"_eo_merge_{uuid.uuid4().hex}"
        on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in self.key_columns)
        sets = ", ".join(f"t.{_quote(c)} = " + (f"t.{_quote(c)} + s.{_quote(c)}" if self.updates.get(c) == "add"
                                               else f"s.{_quote(c)}")
                         for c in source.columns if c not in self.key_columns)
        matched = f" WHEN MATCHED THEN UPDATE SET {sets}" if sets else ""
        statement = (f"MERGE INTO {_quote_table(self.table)} t USING {view} s ON {on}{matched} "
                     "WHEN NOT MATCHED THEN INSERT *")
        jvm = spark._jvm
        assert jvm is not None
        ensure_callback_server_started(spark.sparkContext._gateway)
        java_properties = jvm.java.util.HashMap()
        for key, value in properties.items():
            java_properties.put(key, value)
        source.createOrReplaceTempView(view)
        try:
            jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
                java_properties, _JavaCallable(lambda: spark.sql(statement)),
                jvm.java.lang.Class.forName("java.lang.RuntimeException"))
        finally:
            spark.catalog.dropTempView(view)


class _JavaCallable:
    """A Python function as a ``java.util.concurrent.Callable`` (a py4j callback)."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self.function = function

    def call(self) -> None:
        self.function()

    class Java:
        implements = ["java.util.concurrent.Callable"]


def snapshot_properties(batch: BatchContext, txn: TableTransaction) -> dict[str, str]:
    """What a snapshot's summary says of its batch: pipeline, batch, app id, interval and the offset ranges (JSON
    ``[[topic, partition, from, until], ...]``)."""
    properties = {PIPELINE: batch.pipeline_id, BATCH: str(batch.batch_id), APP_ID: txn.app_id,
                  RANGES: json.dumps([[r.topic, r.partition, r.from_offset, r.until_offset]
                                      for r in sorted(batch.ranges)])}
    if batch.interval is not None:
        properties[INTERVAL] = f"{batch.interval.start.isoformat()}/{batch.interval.end.isoformat()}"
    return properties


def _require_iceberg_session(spark: SparkSession, name: str, table: str, needed: str) -> None:
    """A session without Iceberg's SQL extension or the table's catalog cannot MERGE nor create it: say so (a
    session of this process started before the Iceberg sink's conf, which Spark cannot add to a running one)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    catalog = table.split(".")[0]
    if needed not in extensions or not spark.conf.get(f"spark.sql.catalog.{catalog}", ""):
        raise ConfigurationError(
            f"{name}: the Spark session runs without Iceberg's extensions or the catalog {catalog!r} "
            f"(spark.sql.extensions={extensions!r}); it was started before an Iceberg sink asked for them. Start "
            "the worker's Spark session with the Iceberg sink's conf (IcebergTableSink(...).spark_conf()), or run "
            "the pipeline in a process of its own")


def _quote(column: str) -> str:
    """A column name in backticks (a backtick in it doubled), for Spark SQL."""
    return "`" + column.replace("`", "``") + "`"


def _quote_table(name: str) -> str:
    """``catalog.namespace.table`` (parts validated by the spec), each part quoted."""
    return ".".join(map(_quote, name.split(".")))
