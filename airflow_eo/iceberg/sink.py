"""Apache Iceberg table sink (``docs/architecture.md``, "Sinks"): the table's commit is the commit point.

A batch is one Iceberg snapshot: an append (``DataFrameWriterV2`` with ``snapshot-property.*`` write options) or a
``MERGE INTO`` (its snapshot properties through Iceberg's ``CommitMetadata.withCommitProperties``, which holds them
for the Java thread that runs the MERGE). Each snapshot's summary names the pipeline, the batch, its app id (one per
data interval in interval mode) and its offset ranges. Iceberg has no idempotent write (apache/iceberg#8809), so the
sink asks first: every attempt reads the table's snapshots (pyiceberg on the driver, without Spark) and writes
nothing when the current snapshot's ancestry already holds the batch; the offset store mirrors the commit afterwards
and recovery rolls it forward when the table has a batch the store does not
(:func:`~airflow_eo.core.recovery.committed_by_table`).

Asking first is not enough against an older attempt still running (a zombie that asked before the newer attempt
committed): the write is staged, not committed (Iceberg's write-audit-publish: ``spark.wap.id`` = the batch's
identity on a table with ``write.wap.enabled``), and the staged snapshot is then published by a commit that checks
inside it, against the table it commits to, that the batch is not there yet:

- an append is cherry-picked (``system.cherrypick_snapshot``): Iceberg refuses a staged append whose ``wap.id`` the
  current snapshot's ancestry already published (``DuplicateWAPCommitException``, ``WapUtil.validateWapPublish``,
  checked again on each of its commit retries);
- a ``MERGE`` is only fast-forwarded: the table's current snapshot must still be the staged snapshot's parent (a
  compare-and-set of the table's metadata, ``TableOperations.commit``), and that parent's ancestry must not hold the
  batch. Cherry-pick does not do for a MERGE: it fast-forwards an overwrite without the ``wap.id`` check, and it
  re-applies an insert-only MERGE (an "append") onto a table that changed since the MERGE read it.

A conflict with another writer of the table (Iceberg's ``CommitFailedException`` / ``ValidationException``, a MERGE
that can no longer fast-forward) is retried, a bounded number of times with backoff, asking the table again first.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_eo.core.batch import BatchContext, BatchRecord, WritePlan, WriteResult
from airflow_eo.core.changes import DELETE_MARKERS_SUFFIX, DELETED_AT
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.identifiers import backquote as _quote
from airflow_eo.core.recovery import (
    TableTransaction,
    check_table_claim,
    committed_by_table,
    table_claim,
    table_transaction,
)
from airflow_eo.core.spark_conf import SPARK_SQL_REDACTION_DEFAULT, with_secret_redaction
from airflow_eo.iceberg.catalog import CatalogProperties, reader_catalog
from airflow_eo.iceberg.snapshots import (
    APP_ID,
    BATCH,
    PIPELINE,
    STAGE,
    ancestor_ids,
    batch_summary,
    latest_metadata_file,
    snapshot_properties,
    wap_id,
)
from airflow_eo.lakehouse.adapter import TableCommitAdapter, is_connect, named_failure
from airflow_eo.lakehouse.changes import ChangeTables, change_merge_statement

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: the table property that makes Spark stage a write whose session sets ``spark.wap.id`` instead of committing it
WAP_ENABLED = "write.wap.enabled"
WAP_ID_CONF = "spark.wap.id"
_DUPLICATE = re.compile(r"DuplicateWAPCommitException|wap id that was published already")
_CONFLICT = re.compile(r"CommitFailedException|ValidationException|Found conflicting|Missing required files|"
                       r"stale table metadata|already exists: .*metadata|not a fast-forward|"
                       r"Cannot cherry-pick")


class IcebergTableAdapter(TableCommitAdapter):
    """The run-time side of :class:`~airflow_eo.iceberg.specs.IcebergTableSink` (a ``core.protocol.Sink``).

    :param pipeline_id: the pipeline whose batches these are.
    :param name: the sink kind's name, for messages.
    :param table: ``catalog.namespace.table``, as Spark names it.
    :param location: the table's folder in a Hadoop catalog, where pyiceberg reads its metadata.
    :param catalog: the catalog an Airflow connection names (None: a Hadoop catalog at ``location``); pyiceberg
        reads the table through it, and the adapter sets its properties on the Spark session before the first write.
    :param key_columns: empty: append; else the MERGE key.
    :param updates: ``replace`` / ``add`` per non-key column (MERGE only).
    :param partition_by: identity partition columns of a table created here.
    :param extensions: the SQL extensions class the session must run with (MERGE, the table's creation).
    """

    def __init__(self, pipeline_id: str, *, name: str, table: str, location: str, key_columns: Sequence[str] = (),
                 updates: Mapping[str, str] | None = None, partition_by: Sequence[str] = (),
                 extensions: str = "", catalog: CatalogProperties | None = None) -> None:
        self.pipeline_id, self.name, self.table, self.location = pipeline_id, name, table, location
        self.catalog = catalog
        self._reader: Any = None  # pyiceberg's catalog, made on first use
        self.key_columns = tuple(key_columns)
        self.updates = dict(updates or {})
        self.partition_by = tuple(partition_by)
        self.extensions = extensions
        #: the snapshot the last write of this adapter committed (None: skipped, or nothing written)
        self.last_snapshot_id: int | None = None

    # ------------------------------------------------------------------ the table's snapshots

    def metadata(self) -> Any:
        """The table's metadata as pyiceberg reads it: from the catalog (a connection's), or from a Hadoop catalog's
        folder (its ``version-hint.text``); None: no table yet."""
        from pyiceberg.table import StaticTable

        if self.catalog is not None:
            from pyiceberg.exceptions import NoSuchTableError

            if self._reader is None:
                self._reader = reader_catalog(self.table.split(".")[0], self.catalog)
            try:
                return self._reader.load_table(tuple(self.table.split(".")[1:])).metadata
            except NoSuchTableError:
                return None
        try:
            return StaticTable.from_metadata(latest_metadata_file(self.location)).metadata
        except FileNotFoundError:
            return None

    def batch_snapshots(self, metadata: Any = None, head: Any = None) -> list[tuple[int, dict[str, str]]]:
        """``(snapshot id, summary)`` of ``head`` (default: the current snapshot) and its ancestors that carry an
        airflow_eo batch, newest first (a rolled-back snapshot is not the table's any more); empty when there is no
        table yet."""
        from pyiceberg.table.snapshots import ancestors_of

        metadata = metadata or self.metadata()
        if metadata is None:
            return []
        return [(s.snapshot_id, summary) for s in ancestors_of(head or metadata.current_snapshot(), metadata)
                if BATCH in (summary := batch_summary(s, metadata))]

    @property
    def table_label(self) -> str:
        return f"the Iceberg table {self.table}"

    def committed_versions(self) -> dict[str, int]:
        """The highest batch id the table holds per app id."""
        versions: dict[str, int] = {}
        for _, summary in self.batch_snapshots():
            app_id, batch_id = summary.get(APP_ID, ""), table_claim(summary[BATCH])
            if batch_id is not None:  # another writer's property of that name: not ours
                versions[app_id] = max(batch_id, versions.get(app_id, batch_id))
        return versions

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        """The unfinished batches the table committed (a snapshot of their app id reached them) but the store
        did not."""
        return committed_by_table(unfinished, self.committed_versions(), self.table_label)

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
        interval) is not written again. The write is staged, then published by a commit that checks the batch is
        not in the table it commits to (the module's docstring); a conflict with another writer is retried.
        """
        return self._write(plan, batch, changes=False)

    def write_changes(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """:meth:`write` for a batch of changes (``airflow_eo/lakehouse/changes.py``): their delete markers first,
        then one MERGE guarded by the rows' positions, staged and published as the batch's snapshot."""
        return self._write(plan, batch, changes=True)

    def _write(self, plan: WritePlan, batch: BatchContext, changes: bool) -> WriteResult:
        out: DataFrame = plan.output
        spark = out.sparkSession
        _require_iceberg_session(spark, self.name, self.table, self.extensions)
        self._configure_catalog(spark)
        txn = table_transaction(batch.pipeline_id, batch.batch_id, batch.interval)
        if self._has(txn):
            return WriteResult([], 0)
        self.missing_output_columns(out)
        tables = self._change_tables() if changes else None
        # Materialized once for every try: MERGE INTO refuses a source whose plan is not deterministic (the
        # offset-order id).
        if tables is not None:
            newest = tables.newest(out)
            self._create(spark, newest.drop(DELETE_COLUMN, DELETED_AT))  # its schema: no Spark job
            source = tables.unmarked(spark, newest).localCheckpoint(eager=True)
            tables.add_position_column(spark)
            tables.write_markers(spark, source, lambda merge: self.commit_with_retries(
                batch.batch_id, merge, _conflict, lambda: False))
        else:
            self._create(spark, out)
            source = self.merge_source(out).localCheckpoint(eager=True) if self.key_columns else out
        properties = snapshot_properties(batch, txn)
        self.last_snapshot_id = None

        def stage_and_publish() -> dict[str, str] | None:
            staged, summary = self._stage(spark, source, properties, txn, changes)
            if self._has(txn, staged):  # committed by another attempt since we asked
                return None
            failpoint("before_table_commit")
            self.last_snapshot_id = self._publish(spark, staged.snapshot_id, staged.parent_snapshot_id)
            return summary

        summary = self.commit_with_retries(batch.batch_id, stage_and_publish, _conflict, lambda: self._has(txn))
        if summary is None:
            return WriteResult([], 0)
        failpoint("after_table_commit")
        if tables is not None:
            tables.purge_markers(spark, batch.batch_id)
        # A MERGE's count is its source's (one row per key updates or inserts one row); an append's from its
        # snapshot: no second pass over the output.
        rows = source.count() if self.key_columns else int(summary.get("added-records", 0))
        log.info("%s: committed batch %d as snapshot %s of the Iceberg table %s", self.name, batch.batch_id,
                 self.last_snapshot_id, self.table)
        return WriteResult([], rows)

    def _configure_catalog(self, spark: SparkSession) -> None:
        """The connection's catalog properties on the running session, each one the operator's spark_conf does not
        set (Spark reads a catalog's properties when a query first uses it; set here, a secret never is on a command
        line nor in the session's launch conf)."""
        if self.catalog is None:
            return
        # Before the first secret is set: every later query's SQL execution carries the session's changed conf (the
        # SQL tab, the event log), redacted by this SQL conf (a session not started here: a Connect server's).
        redaction = "spark.sql.redaction.options.regex"
        wanted = with_secret_redaction(spark.conf.get(redaction, None) or SPARK_SQL_REDACTION_DEFAULT)
        if spark.conf.get(redaction, None) != wanted:
            spark.conf.set(redaction, wanted)
        prefix = f"spark.sql.catalog.{self.table.split('.')[0]}"
        for key, value in self.catalog.spark.items():
            if spark.conf.get(f"{prefix}.{key}", None) is None:
                spark.conf.set(f"{prefix}.{key}", value)

    def _has(self, txn: TableTransaction, staged: Any = None) -> bool:
        """Whether the table holds the batch: its current snapshot's history, or (``staged``) the history a staged
        snapshot would publish, its parent's (which no later commit changes)."""
        metadata = self.metadata()
        head = None
        if staged is not None:
            if staged.parent_snapshot_id is None:
                return False  # staged on an empty table
            head = metadata.snapshot_by_id(staged.parent_snapshot_id)
        done = max((b for _, s in self.batch_snapshots(metadata, head)
                    if s.get(APP_ID) == txn.app_id and (b := table_claim(s[BATCH])) is not None), default=None)
        if done is None or done < txn.version:
            return False
        check_table_claim(self.table_label, txn, done, txn.version)  # the batch written is the newest planned
        self.last_snapshot_id = None
        log.info("%s: the Iceberg table %s already has batch %d (%s at batch %d); not writing it again",
                 self.name, self.table, txn.version, txn.app_id, done)
        return True

    def _change_tables(self) -> ChangeTables:
        """The target and its delete markers (an Iceberg table beside it: ``<table>_eo_delete_markers``)."""
        return ChangeTables(_quote_table(self.table), _quote_table(self.table + DELETE_MARKERS_SUFFIX), "iceberg",
                            self.key_columns, self.name)

    def _stage(self, spark: SparkSession, source: DataFrame, properties: Mapping[str, str],
               txn: TableTransaction, changes: bool = False) -> tuple[Any, dict[str, str]]:
        """Write the batch as a staged snapshot (Spark stages instead of committing: ``spark.wap.id`` on a table with
        ``write.wap.enabled``): ``(its snapshot, its summary)``, read back with pyiceberg by its stage token."""
        token = uuid.uuid4().hex
        properties = {**properties, STAGE: token}
        spark.conf.set(WAP_ID_CONF, wap_id(txn))
        try:
            if self.key_columns:
                self._merge(spark, source, properties, changes)
            else:
                writer = source.writeTo(_quote_table(self.table))
                for key, value in properties.items():
                    writer = writer.option(f"snapshot-property.{key}", value)
                writer.append()
        finally:
            spark.conf.unset(WAP_ID_CONF)
        metadata = self.metadata()
        staged = next((s for s in (metadata.snapshots if metadata else [])
                       if s.summary and s.summary.additional_properties.get(STAGE) == token), None)
        if staged is None or staged.snapshot_id in ancestor_ids(metadata):
            # Spark committed instead of staging (its loaded table did not have write.wap.enabled): never the case
            # for a table this sink set up; refuse rather than lose the check.
            raise RuntimeError(f"{self.name}: the write of the batch to the Iceberg table {self.table} was not "
                               f"staged (snapshot {staged and staged.snapshot_id}); the table needs "
                               f"{WAP_ENABLED}=true")
        return staged, dict(staged.summary.additional_properties)

    def _publish(self, spark: SparkSession, snapshot_id: int, parent_id: int | None) -> int:
        """Make the staged snapshot the table's, checking inside the commit that the batch is not there yet (the
        module's docstring): an append cherry-picked, a MERGE fast-forwarded only. The table's new current
        snapshot id."""
        if not self.key_columns:
            catalog, _, name = self.table.partition(".")
            [row] = spark.sql(f"CALL {_quote(catalog)}.system.cherrypick_snapshot('{name}', {snapshot_id})").collect()
            return int(row["current_snapshot_id"])
        jvm = spark._jvm
        assert jvm is not None  # _merge required a classic session
        table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, self.table)
        operations = table.operations()
        base = operations.refresh()
        current = base.currentSnapshot()
        if (current.snapshotId() if current is not None else None) != parent_id:
            # Another commit since the MERGE read the table: its result is not valid any more; MERGE again.
            raise RuntimeError(f"the staged MERGE snapshot {snapshot_id} is not a fast-forward of the table's "
                               f"current snapshot {current and current.snapshotId()} (another writer committed)")
        # Compare-and-set: fails (CommitFailedException) unless `base` is still the table's metadata.
        operations.commit(base, jvm.org.apache.iceberg.TableMetadata.buildFrom(base)
                          .setBranchSnapshot(snapshot_id, "main").build())
        return snapshot_id

    def _create(self, spark: SparkSession, out: DataFrame) -> None:
        """The table from the output's schema when missing (``IF NOT EXISTS``: a concurrent attempt may have created
        it since), with ``write.wap.enabled`` (set on a table that lacks it). Its own commit, without a snapshot: an
        empty table has none."""
        metadata = self.metadata()
        if metadata is not None:
            if metadata.properties.get(WAP_ENABLED) != "true":
                spark.sql(f"ALTER TABLE {_quote_table(self.table)} SET TBLPROPERTIES ('{WAP_ENABLED}'='true')")
                log.info("%s: set %s on the Iceberg table %s (its writes are staged, then published)", self.name,
                         WAP_ENABLED, self.table)
            return
        columns = ", ".join(f"{_quote(f.name)} {f.dataType.simpleString()}" for f in out.schema.fields)
        partitioned = f" PARTITIONED BY ({', '.join(map(_quote, self.partition_by))})" if self.partition_by else ""
        namespace = _quote_table(self.table.rsplit(".", 1)[0])
        try:
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
            spark.sql(f"CREATE TABLE IF NOT EXISTS {_quote_table(self.table)} ({columns}) USING iceberg"
                      f"{partitioned} TBLPROPERTIES ('{WAP_ENABLED}'='true')")
        except Exception:
            # Another writer created it between the catalog's existence check and its commit: the table is there.
            if self.metadata() is None:
                raise
            return self._create(spark, out)  # sets write.wap.enabled if that writer did not
        log.info("%s: created the Iceberg table %s from the output's schema", self.name, self.table)

    def _merge(self, spark: SparkSession, source: DataFrame, properties: Mapping[str, str],
               changes: bool = False) -> None:
        """``MERGE INTO`` the table, its snapshot carrying ``properties``: Iceberg takes them from
        ``CommitMetadata.withCommitProperties``, a thread-local of the JVM thread that runs the callable. The MERGE
        runs inside it as a Python callback: pyspark's pinned-thread gateway runs a callback's calls back into the
        JVM on the thread that called it."""
        from pyspark.java_gateway import ensure_callback_server_started

        if getattr(spark, "_jvm", None) is None:
            raise ConfigurationError(f"{self.name}: MERGE with snapshot properties needs a classic Spark session "
                                     "(py4j); over Spark Connect use the sink without key_columns (append)")
        view = f"_eo_merge_{uuid.uuid4().hex}"
        on, sets = self.merge_clauses(source.columns)
        matched = f" WHEN MATCHED THEN UPDATE SET {sets}" if sets else ""
        statement = (f"MERGE INTO {_quote_table(self.table)} t USING {view} s ON {on}{matched} "
                     "WHEN NOT MATCHED THEN INSERT *")
        if changes:
            columns = [c for c in source.columns if c not in (DELETE_COLUMN, DELETED_AT)]
            statement = change_merge_statement(_quote_table(self.table), view, self.key_columns, columns)
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


def _conflict(exc: BaseException) -> str | None:
    """What makes ``exc`` a commit conflict with another writer or a refused duplicate publish (None: neither)."""
    if named_failure(exc, _DUPLICATE):
        return "DuplicateWAPCommitException (the batch's wap.id is published already)"
    return named_failure(exc, _CONFLICT)


def _require_iceberg_session(spark: SparkSession, name: str, table: str, needed: str) -> None:
    """A session without Iceberg's SQL extension or the table's catalog cannot MERGE nor create it: say so (a
    session of this process started before the Iceberg sink's conf, which Spark cannot add to a running one)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    catalog = table.split(".")[0]
    if needed not in extensions and is_connect(spark):
        raise ConfigurationError(
            f"{name}: the Spark Connect server runs without Iceberg (spark.sql.extensions={extensions!r}); a client "
            "cannot add jars or SQL extensions to it. Start the server with Iceberg's runtime jar and "
            f"spark.sql.extensions={needed} (docs/how-to/iceberg.md)")
    if needed not in extensions or not spark.conf.get(f"spark.sql.catalog.{catalog}", ""):
        raise ConfigurationError(
            f"{name}: the Spark session runs without Iceberg's extensions or the catalog {catalog!r} "
            f"(spark.sql.extensions={extensions!r}); it was started before an Iceberg sink asked for them. Start "
            "the worker's Spark session with the Iceberg sink's conf (IcebergTableSink(...).spark_conf()), or run "
            "the pipeline in a process of its own")


def _quote_table(name: str) -> str:
    """``catalog.namespace.table`` (parts validated by the spec), each part quoted."""
    return ".".join(map(_quote, name.split(".")))
