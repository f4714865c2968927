"""Delta Lake table sink (``docs/architecture.md``, "Sinks"): the table's commit is the commit point.

A batch is one Delta commit: an append (``df.write`` with the ``txnAppId`` / ``txnVersion`` options) or a ``MERGE``
(the same identity through Delta's session confs ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``). Delta
records the identity as a ``txn`` action in the table's log and skips a later write whose version is not above the
recorded one, so a batch lands once whatever retries follow. The offset store mirrors the commit afterwards; the
next attempt asks the table (its ``txn`` of the app id, read by delta-rs on the driver, without Spark) whether an
unfinished batch committed, and rolls the store forward if so (:func:`~airflow_eo.core.recovery.committed_by_table`).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_eo.core.batch import BatchContext, BatchRecord, WritePlan, WriteResult
from airflow_eo.core.changes import DELETE_MARKERS_SUFFIX, DELETED_AT
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.identifiers import backquote as _q
from airflow_eo.core.recovery import TableTransaction, check_table_claim, committed_by_table, table_transaction
from airflow_eo.lakehouse.adapter import TableCommitAdapter, is_connect, named_failure, sql_string
from airflow_eo.lakehouse.changes import ChangeTables, change_merge_statement

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
#: how many of the table's newest versions ``airflow eo status`` looks through for the pipeline's last batch
_STATUS_HISTORY = 100


class DeltaTableAdapter(TableCommitAdapter):
    """The run-time side of :class:`~airflow_eo.delta.specs.DeltaTableSink` (a ``core.protocol.Sink``).

    :param pipeline_id: the pipeline whose batches these are.
    :param name: the sink kind's name, for messages.
    :param path: the table's location.
    :param table: a name registered for ``path`` in the session's catalog (empty: none).
    :param key_columns: empty: append; else the MERGE key.
    :param updates: ``replace`` / ``add`` per non-key column (MERGE only).
    :param partition_by: partition columns of a table created here.
    """

    def __init__(self, pipeline_id: str, *, name: str, path: str, table: str = "", key_columns: Sequence[str] = (),
                 updates: Mapping[str, str] | None = None, partition_by: Sequence[str] = ()) -> None:
        self.pipeline_id, self.name, self.path, self.table = pipeline_id, name, path, table
        self.key_columns = tuple(key_columns)
        self.updates = dict(updates or {})
        self.partition_by = tuple(partition_by)
        #: the table version the last write of this adapter committed (None: skipped, or nothing written)
        self.last_version: int | None = None

    # ------------------------------------------------------------------ the table's log

    def log(self) -> Any:
        """The table's transaction log as delta-rs reads it on the driver (no Spark job); None: no table yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path)
        except TableNotFoundError:
            return None

    @property
    def table_label(self) -> str:
        return f"the Delta table at {self.path}"

    def committed_version(self, app_id: str) -> int | None:
        """The highest version the table recorded for ``app_id`` (its ``txn`` actions); None when it has none or
        the table does not exist yet."""
        table = self.log()
        return None if table is None else table.transaction_version(app_id)

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        """The unfinished batches the table committed (their app id's version reached them) but the store did not."""
        app_ids = {table_transaction(b.pipeline_id, b.batch_id, b.interval).app_id for b in unfinished}
        return committed_by_table(unfinished, {a: self.committed_version(a) for a in app_ids}, self.table_label)

    def table_state(self, pipeline_id: str) -> str:
        """The table's latest version and the pipeline's newest batch in it (``airflow eo status``)."""
        table = self.log()
        if table is None:
            return f"Delta table {self.path}: not created yet (the pipeline's first batch with output creates it)"
        for entry in table.history(_STATUS_HISTORY):
            meta = _batch_metadata(entry.get("userMetadata"))
            if meta.get("airflow_eo.pipeline") == pipeline_id:
                return (f"Delta table {self.path}: version {table.version()}; this pipeline's last batch in it: "
                        f"batch {meta.get('airflow_eo.batch')} at version {entry.get('version')}")
        return (f"Delta table {self.path}: version {table.version()}; no batch of this pipeline in its last "
                f"{_STATUS_HISTORY} versions")

    # ------------------------------------------------------------------ protocol steps

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """THE commit point: the batch's output as one Delta commit carrying the batch's identity.

        Asks the table first: a batch it already has (a retry after a crash past the table commit, a replayed
        interval) is not written again.
        """
        return self._write(plan, batch, changes=False)

    def write_changes(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """:meth:`write` for a batch of changes (``airflow_eo/lakehouse/changes.py``): their delete markers first,
        then one MERGE guarded by the rows' positions, in the commit carrying the batch's identity."""
        return self._write(plan, batch, changes=True)

    def _write(self, plan: WritePlan, batch: BatchContext, changes: bool) -> WriteResult:
        out: DataFrame = plan.output
        spark = out.sparkSession
        _require_delta_session(spark, self.name)
        txn = table_transaction(batch.pipeline_id, batch.batch_id, batch.interval)
        if self._has(txn):
            return WriteResult([], 0)
        if self.table:  # after the check: a replayed batch's run does not start the catalog (a metastore client)
            self._register(spark)
        self.missing_output_columns(out)
        tables = self._change_tables() if changes else None
        # Materialized once for every try (Delta would materialize it in each: the offset-order id makes it not
        # deterministic); its job is the one that reads the batch, and counts its records (the plan's observation).
        if tables is not None:
            source = tables.unmarked(spark, tables.newest(out)).localCheckpoint(eager=True)
            columns = [c for c in source.columns if c not in (DELETE_COLUMN, DELETED_AT)]
        else:
            source = self.merge_source(out).localCheckpoint(eager=True) if self.key_columns else out
            columns = out.columns
        # An append creates the table in its own commit, unless it also has a name (created with it).
        if self.log() is None and (self.key_columns or self.table):
            self._create(spark, out if tables is None else source.select(*map(_q, columns)))
        if tables is not None:
            tables.add_position_column(spark)
            tables.write_markers(spark, source, lambda merge: self.commit_with_retries(
                batch.batch_id, merge, _conflict, lambda: False))
        metadata = json.dumps(_commit_metadata(batch, txn), sort_keys=True)
        failpoint("before_table_commit")

        def commit() -> int:
            if tables is not None:
                self._merge(spark, source, columns, txn, metadata, changes=True)
                return self._committed_rows(metadata, ("numTargetRowsInserted", "numTargetRowsUpdated",
                                                       "numTargetRowsDeleted"))
            if self.key_columns:
                self._merge(spark, source, columns, txn, metadata)
                return self._committed_rows(metadata, ("numTargetRowsInserted", "numTargetRowsUpdated"))
            self._append(out, txn, metadata)
            return self._committed_rows(metadata, ("numOutputRows",))

        # A conflict with another writer of the table (Delta's ConcurrentAppendException, ...) is retried; Delta
        # checks the batch's txn inside each commit, and the table is asked again before each retry.
        rows = self.commit_with_retries(batch.batch_id, commit, _conflict, lambda: self._has(txn))
        if rows is None:
            return WriteResult([], 0)
        failpoint("after_table_commit")
        if tables is not None:
            tables.purge_markers(spark, batch.batch_id)
        return WriteResult([], rows)

    def _change_tables(self) -> ChangeTables:
        """The target and its delete markers (a Delta table beside it: ``<path>_eo_delete_markers``)."""
        markers = f"delta.{_q(self.path.rstrip('/') + DELETE_MARKERS_SUFFIX)}"
        return ChangeTables(self._path_table, markers, "delta", self.key_columns, self.name)

    def _has(self, txn: TableTransaction) -> bool:
        """Whether the table's txn of the batch's app id reached the batch."""
        table = self.log()
        done = None if table is None else table.transaction_version(txn.app_id)
        if done is None or done < txn.version:
            return False
        check_table_claim(self.table_label, txn, done, txn.version)  # the batch written is the newest planned
        log.info("%s: the Delta table at %s already has batch %d (%s at version %d); not writing it again",
                 self.name, self.path, txn.version, txn.app_id, done)
        self.last_version = None
        return True

    def _register(self, spark: SparkSession) -> None:
        """``table`` names ``path`` in the session's catalog: registered when the table is at ``path`` and the name
        is free (a crash between the table's creation and its registration, a table created before it had a name);
        a name of another location is refused. The in-memory catalog is refused: it forgets the name when the
        process ends."""
        catalog_kind = spark.conf.get("spark.sql.catalogImplementation", "in-memory")
        if self.table.count(".") == 1 and catalog_kind == "in-memory":
            raise ConfigurationError(
                f"{self.name}: table={self.table!r} would be registered in Spark's in-memory catalog, which forgets "
                "it when the task's process ends (each Airflow task is a process of its own). Configure a catalog "
                "that keeps it in the operator's spark_conf (spark.sql.catalogImplementation=hive with a Hive "
                "metastore), name a catalog that does (catalog.db.table), or drop table= (path= alone works)")
        quoted = ".".join(map(_q, self.table.split(".")))
        if spark.catalog.tableExists(self.table):
            [row] = spark.sql(f"DESCRIBE DETAIL {quoted}").select("location").collect()
            if _location(row["location"]) != _location(self.path):
                raise ConfigurationError(f"{self.name}: the catalog's table {self.table} is at {row['location']}, "
                                         f"not at the sink's path {self.path}")
            return
        if self.log() is None:
            return  # _create makes the table under its name
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quoted.rsplit('.', 1)[0]}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {quoted} USING delta LOCATION {sql_string(self.path)}")
        log.info("%s: registered the Delta table at %s as %s", self.name, self.path, self.table)

    def _create(self, spark: SparkSession, out: DataFrame) -> None:
        """The table at ``path`` from the output's schema (a commit of its own; ``IF NOT EXISTS``: a concurrent
        attempt may have created it since), under its name too when it has one. SQL, not Delta's Python builder:
        over Spark Connect that needs Delta's Connect plugin on the server, SQL only Delta's SQL extension."""
        columns = ", ".join(f"{_q(f.name)} {f.dataType.simpleString()}" + ("" if f.nullable else " NOT NULL")
                            for f in out.schema.fields)
        partitioned = f" PARTITIONED BY ({', '.join(map(_q, self.partition_by))})" if self.partition_by else ""
        if self.table:
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {'.'.join(map(_q, self.table.split('.')[:-1]))}")
            target = f"{'.'.join(map(_q, self.table.split('.')))} ({columns}) USING delta{partitioned} " \
                     f"LOCATION {sql_string(self.path)}"
        else:
            target = f"{self._path_table} ({columns}) USING delta{partitioned}"
        for attempt in range(1, self.commit_tries + 1):
            try:
                spark.sql(f"CREATE TABLE IF NOT EXISTS {target}")
                break
            except Exception:
                # Another writer is creating it: between Delta's existence check and its first commit (Delta then
                # says DELTA_TABLE_NOT_FOUND), or its _delta_log is there without a commit yet
                # (DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION). Once its commit is there, the table is created.
                if self.log() is not None:
                    log.info("%s: the Delta table at %s was created meanwhile by another writer", self.name,
                             self.path)
                    return
                if attempt == self.commit_tries:
                    raise
                time.sleep(self.commit_backoff_s * attempt)
        log.info("%s: created the Delta table at %s from the output's schema%s", self.name, self.path,
                 f" as {self.table}" if self.table else "")

    def _append(self, out: DataFrame, txn: TableTransaction, metadata: str) -> None:
        writer = (out.write.format("delta").mode("append")
                  .option("txnAppId", txn.app_id).option("txnVersion", txn.version).option("userMetadata", metadata))
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(self.path)

    def _merge(self, spark: SparkSession, source: DataFrame, columns: Sequence[str], txn: TableTransaction,
               metadata: str, changes: bool = False) -> None:
        """MERGE the batch's :meth:`merge_source` (or newest changes), materialized, on the key."""
        on, sets = self.merge_clauses(columns)
        names, values = ", ".join(map(_q, columns)), ", ".join(f"s.{_q(c)}" for c in columns)
        view = f"_eo_merge_{uuid.uuid4().hex}"
        # SQL, not Delta's Python MERGE builder: over Spark Connect that needs Delta's Connect plugin on the server.
        statement = (change_merge_statement(self._path_table, view, self.key_columns, columns) if changes else
                     f"MERGE INTO {self._path_table} t USING {view} s ON {on}"
                     + (f" WHEN MATCHED THEN UPDATE SET {sets}" if sets else "")
                     + f" WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})")
        # MERGE takes the idempotent identity from the session (a batch's confs, restored after it: a later write of
        # this session must not carry them). The source is materialized already: Delta need not copy it again.
        confs = {_TXN_APP_ID: txn.app_id, _TXN_VERSION: str(txn.version), _USER_METADATA: metadata,
                 _MATERIALIZE_SOURCE: "none"}
        before = {key: spark.conf.get(key, None) for key in confs}
        source.createOrReplaceTempView(view)
        try:
            for key, value in confs.items():
                spark.conf.set(key, value)
            spark.sql(statement).collect()
        finally:
            for key, was in before.items():
                if was is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, was)
            spark.catalog.dropTempView(view)

    @property
    def _path_table(self) -> str:
        """The table at ``path`` as Spark SQL names it: ``delta.`<path>```."""
        return f"delta.{_q(self.path)}"

    def _committed_rows(self, metadata: str, metrics: Sequence[str]) -> int:
        """The rows the batch's commit wrote, from its entry in the table's history (found by its metadata: another
        writer may have committed since); records its version."""
        table = self.log()
        for entry in table.history(20) if table is not None else ():
            if entry.get("userMetadata") == metadata:
                self.last_version = int(entry["version"])
                log.info("%s: committed as version %d of the Delta table at %s", self.name, self.last_version,
                         self.path)
                found = entry.get("operationMetrics") or {}
                return sum(int(found.get(m, 0)) for m in metrics)
        self.last_version = None  # skipped by Delta (a concurrent attempt committed it first)
        return 0


#: Delta's commit conflicts with another writer (its concurrent modification exceptions and error classes)
_CONFLICTS = re.compile(r"Concurrent(?:Append|DeleteRead|DeleteDelete|Transaction|Write)Exception|"
                        r"MetadataChangedException|ProtocolChangedException|DELTA_CONCURRENT_\w+|"
                        r"DELTA_METADATA_CHANGED|DELTA_PROTOCOL_CHANGED")


def _conflict(exc: BaseException) -> str | None:
    return named_failure(exc, _CONFLICTS)


def _commit_metadata(batch: BatchContext, txn: TableTransaction) -> dict[str, Any]:
    """What a version's ``userMetadata`` says of its batch (``DESCRIBE HISTORY`` shows it): pipeline, batch, app id,
    interval and the offset ranges."""
    return {
        "airflow_eo.pipeline": batch.pipeline_id,
        "airflow_eo.batch": batch.batch_id,
        "airflow_eo.app_id": txn.app_id,
        "airflow_eo.interval": None if batch.interval is None else
        [batch.interval.start.isoformat(), batch.interval.end.isoformat()],
        "airflow_eo.ranges": [[r.topic, r.partition, r.from_offset, r.until_offset] for r in sorted(batch.ranges)],
    }


def _batch_metadata(text: str | None) -> dict[str, Any]:
    """A version's ``userMetadata`` as airflow_eo wrote it; empty for another writer's (or none)."""
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _require_delta_session(spark: SparkSession, name: str) -> None:
    """A session without Delta's SQL extension cannot MERGE nor create tables: say so (a session of this process
    started before the Delta sink's conf, which Spark cannot add to a running session)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if "io.delta.sql.DeltaSparkSessionExtension" not in extensions and is_connect(spark):
        raise ConfigurationError(
            f"{name}: the Spark Connect server runs without Delta Lake (spark.sql.extensions={extensions!r}); a "
            "client cannot add jars or SQL extensions to it. Start the server with Delta's jars and its "
            "spark.sql.extensions / spark.sql.catalog.spark_catalog (docs/how-to/delta.md)")
    if "io.delta.sql.DeltaSparkSessionExtension" not in extensions:
        raise ConfigurationError(
            f"{name}: the Spark session runs without Delta Lake (spark.sql.extensions={extensions!r}); it was "
            "started before a Delta sink asked for it. Start the worker's Spark session with the Delta sink's conf "
            "(DeltaTableSink(...).spark_conf()), or run the pipeline in a process of its own")


def _location(uri: str) -> str:
    """A table location as compared: a local folder with or without ``file:``, without a trailing slash."""
    for prefix in ("file://", "file:"):
        if uri.startswith(prefix):
            uri = uri[len(prefix):]
            break
    return uri.rstrip("/")
