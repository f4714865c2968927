"""Spark execution of one planned batch: read exact ranges, parse, transform, write per partition.

The Kafka read uses Spark's own Kafka source with ``read_committed`` and the batch's
exact ``startingOffsets``/``endingOffsets``. Parsing (``spark/parsing.py``) marks bad records (null value,
malformed JSON, wrong types, missing required fields) instead of dropping them;
``on_bad_record`` decides whether the batch fails or dead-letters them. The sink's
:class:`PartitionWriter` runs inside ``mapInArrow`` so each Spark task writes its
partition from Arrow batches and reports ``(xid, rows)`` to the driver: the engine is the
sinks' :class:`~airflow_eo.core.batch.PartitionRunner`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_eo.arrow_files import KeptBatches
from airflow_eo.core.abilities import (
    ChangeMerges,
    ChangePositions,
    DeadLetterTable,
    RowRefusals,
    SeenIds,
    has_role,
    role,
)
from airflow_eo.core.batch import (
    DEAD_LETTER_FIELDS,
    BatchContext,
    DeadLetter,
    DeadLetterRoute,
    DriverStream,
    ExecutionResult,
    PartitionWriter,
    TaskDedup,
    WritePlan,
    WriteResult,
    dead_letter_partition,
)
from airflow_eo.core.changes import CHANGED_AT, POSITION_COLUMN, TruncatePolicy
from airflow_eo.core.config import BadRecordPolicy, ParseConfig
from airflow_eo.core.dedup import (
    PURGE_LIMIT,
    SEEN_ID_KEY,
    marks_in_write_tasks,
    purge_cutoff,
    purge_until_caught_up,
    seen_id_partition,
)
from airflow_eo.core.errors import BadRecordError, ConfigurationError
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.headers import NO_HEADERS, encode_header_structs
from airflow_eo.core.protocol import Sink
from airflow_eo.core.ranges import spark_offsets
from airflow_eo.core.refused_rows import MAX_REFUSED_PER_TASK, REFUSAL_ROUNDS
from airflow_eo.core.write_strategy import WriteStrategy, choose_write_strategy
from airflow_eo.spark.changes import (
    SKIP,
    PositionPartitions,
    newest_changes,
    position_rows,
    purge_delete_markers,
    transform_changes,
    truncate_position,
    with_key_ids,
)
from airflow_eo.spark.columns import named_columns, positional
from airflow_eo.spark.dedup import (
    DUPLICATE,
    ID,
    MARKED_BY,
    NEW,
    TaskCopies,
    mark_duplicates,
    position_columns,
    seen_id_rows,
    with_event_ids,
)
from airflow_eo.spark.kafka_security import spark_kafka_options
from airflow_eo.spark.parsing import metadata_columns, parse_records
from airflow_eo.spark.refusals import refuse_unstorable
from airflow_eo.spark.refused_rows import (
    WriteRefused,
    find_refused,
    mark_refused,
    raise_if_refused,
    refused_write,
)
from airflow_eo.spark.spark_connect import is_connect

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

BATCH_VIEW = "kafka_batch"  # temp view name for SQL transforms
#: Begins the error a write task raises on a bad record (:meth:`SparkBatchEngine._write_failing_on_bad_records`).
BAD_RECORD_MARK = "airflow_eo: bad record at"

Transform = Callable[["DataFrame", BatchContext], "DataFrame"]

#: What a one-pass batch's partition writers get of a bad record besides its error (NULL on good records, so that
#: the good ones carry next to nothing more through the shuffle): the dead-letter fields, by their source columns.
_DEAD_LETTER_SOURCE = {"_eo_dl_topic": "kafka_topic", "_eo_dl_partition": "kafka_partition",
                       "_eo_dl_offset": "kafka_offset", "_eo_dl_key": "kafka_key", "_eo_dl_value": "kafka_value",
                       "_eo_dl_headers": "kafka_headers"}


def resolve_transform(transform: Transform | str | None) -> Transform | str | None:
    """A callable, a dotted path ``pkg.module.func`` (or ``pkg.module:func``), or Spark SQL text."""
    if transform is None or callable(transform):
        return transform
    if not isinstance(transform, str):
        raise ConfigurationError(f"transform must be a callable, a dotted path or SQL, not {type(transform).__name__}")
    text = transform.strip()
    if text.split(None, 1)[0].upper() in ("SELECT", "WITH"):
        return text
    module_name, _, attr = text.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"transform {text!r} is neither SQL (SELECT ... FROM {BATCH_VIEW}) nor an importable "
            f"dotted path to a function (DataFrame, BatchContext) -> DataFrame: {exc}"
        ) from exc


@dataclass
class SparkBatchEngine:
    """Implements ``core.protocol.Engine`` (and ``core.batch.PartitionRunner``) on a Spark session.

    :param session_factory: returns the SparkSession to use.
    :param kafka_config: librdkafka config of the Kafka connection (bootstrap servers, security).
    :param parse: how records become rows (value format, schema, bad-record policy, writer tasks).
    :param transform: callable / dotted path / SQL over the ``kafka_batch`` view; None keeps the parsed columns.
    :param kafka_options: extra Spark Kafka source options (``kafka.*`` settings for the Java client), no
        secret: credentials come from ``kafka_config`` (:func:`~airflow_eo.spark.kafka_security.spark_kafka_options`).
    :param connect_early: open the session in :meth:`check`, before the attempt's first side effect
        (cheap for Spark Connect: a wrong URL or token fails there; a classic session starts a JVM,
        which an empty batch must not pay for).
    """

    session_factory: Callable[[], SparkSession]
    kafka_config: Mapping[str, Any] = field(repr=False)  # may hold SASL credentials
    parse: ParseConfig
    transform: Transform | str | None = None
    kafka_options: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold a JAAS config
    connect_early: bool = False
    #: Writer schemas of Confluent-framed Avro by id, for ids not in ``parse.writer_schemas`` (a schema registry).
    schema_lookup: Callable[[int], str | None] | None = None
    #: the parsed rows are a transform's output already (a transform over changes): a row the table refuses is no
    #: record, so it fails the batch
    rows_transformed: bool = False
    # The session and the running batch's job tag, for cancel() (on_kill); a batch's write is described by its
    # WritePlan, not by engine state.
    _job_tag: str | None = field(default=None, init=False)
    _spark: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.transform = resolve_transform(self.transform)
        spark_kafka_options(self.kafka_config, self.kafka_options)  # refused here, before any side effect

    def check(self) -> None:
        if self.connect_early:
            self._spark = self.session_factory()

    # ------------------------------------------------------------------ read + parse

    def read(self, spark: SparkSession, batch: BatchContext) -> DataFrame:
        from pyspark.sql import functions as F

        starting, ending = spark_offsets(batch.ranges)
        assign = {t: sorted(int(p) for p in parts) for t, parts in json.loads(starting).items()}
        reader = (spark.read.format("kafka")
                  .option("assign", json.dumps(assign))
                  .option("startingOffsets", starting)
                  .option("endingOffsets", ending)
                  .option("kafka.isolation.level", "read_committed")
                  .option("includeHeaders", "true")
                  .option("failOnDataLoss", "true"))
        for key, value in spark_kafka_options(self.kafka_config, self.kafka_options).items():
            reader = reader.option(key, value)
        raw = reader.load()
        return raw.select(
            F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
            F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"),
            F.col("key").alias("kafka_key"), F.col("headers").alias("kafka_headers"),
            F.col("value").alias("kafka_value"),
        )

    def parse_records(self, spark: SparkSession, raw: DataFrame) -> tuple[DataFrame, list[str]]:
        """Parsed columns + metadata + ``_eo_error`` (NULL for good records); returns payload column names."""
        return parse_records(spark, raw, self.parse, self.schema_lookup)

    # ------------------------------------------------------------------ execute

    def execute(self, batch: BatchContext, sink: Sink) -> ExecutionResult:
        spark = self._spark = self.session_factory()
        self._job_tag = f"airflow_eo-{batch.pipeline_id}-{batch.batch_id}-{batch.epoch}".replace(" ", "_")
        spark.addTag(self._job_tag)
        marked = None
        try:
            parsed, payload = self.parse_records(spark, self.read(spark, batch))
            if self.transform is None:  # a record is a row of the table: what the table refuses, it is refused here
                parsed = refuse_unstorable(parsed, payload, sink)
            if self.parse.changes is not None:  # a change applies when it is its key's newest and newer than its row
                if self.transform is not None:
                    return self._apply_transformed_changes(spark, parsed, payload, batch, sink)
                return self._apply_changes(spark, parsed, payload, batch, sink)
            if self.parse.dedup_key:  # copies of events already seen are dropped before anything else sees them
                in_tasks = self._dedup_in_write_tasks(spark, parsed, payload, batch, sink)
                if in_tasks is not None:
                    return in_tasks
                marked, dedup = self._mark_duplicates(spark, parsed, batch, sink)
                parsed = marked.where(~marked[DUPLICATE]).drop(ID, DUPLICATE, NEW)
                return dedup.into(self._execute_around_refusals(spark, parsed, payload, batch, sink))
            return self._execute_around_refusals(spark, parsed, payload, batch, sink)
        finally:
            if marked is not None:
                marked.unpersist()
            spark.removeTag(self._job_tag)

    def _execute_around_refusals(self, spark: SparkSession, parsed: DataFrame, payload: list[str],
                                 batch: BatchContext, sink: Sink) -> ExecutionResult:
        """:meth:`_execute`; when the table refused a row that no rule could tell before (a constraint, a trigger:
        :mod:`airflow_eo.core.refused_rows`), the records it refuses are found by probes and become bad records, and
        the batch is written again (what the failed write left prepared is rolled back by the probes and the new
        write's tasks; an upsert sink's rows are written again, the same). Under ``on_bad_record="fail"`` the batch
        fails naming the first. A transform's output row cannot be traced to a record: the batch fails."""
        for _ in range(REFUSAL_ROUNDS):
            try:
                return self._execute(spark, parsed, payload, batch, sink)
            except WriteRefused as refused:
                if not has_role(sink, RowRefusals) or not role(sink, RowRefusals).refused_by_output(refused.writer):
                    raise  # the dead-letter or seen-id table: no record of the batch to blame
                table = role(sink, RowRefusals).output_table
                if self.transform is not None or self.rows_transformed:
                    raise BadRecordError(
                        f"table {table} refused a row of the transform's output: {refused.error}. A transformed row "
                        "is not one record, so it cannot become a dead letter: nothing was committed. Change the "
                        "transform (filter what the table refuses) or the table.") from refused
                found, more = find_refused(parsed, refused.writer,
                                           self.parse.write_partitions or _default_parallelism(spark))
                if not found:
                    raise BadRecordError(
                        f"table {table} refused a row of this batch ({refused.error}), but no record alone: rows "
                        "refused only together (two records of one unique value?). Nothing was committed.") from refused
                first = found[0]
                where = f"{first.topic}[{first.partition}] offset {first.offset}"
                if more:
                    raise BadRecordError(
                        f"table {table} refuses more than {MAX_REFUSED_PER_TASK} records of one write task; the "
                        f"first: {where}: {first.error}. Nothing was committed. Fix the table or the producer."
                    ) from refused
                if self.parse.on_bad_record is BadRecordPolicy.FAIL:
                    raise BadRecordError(
                        f"table {table} refused {len(found)} record(s) of this batch; the first: {where}: "
                        f"{first.error}. Nothing was committed. Fix the producer or the table, or set "
                        "on_bad_record='dead_letter' to divert them to the dead-letter table.") from refused
                log.warning("table %s refused %s record(s) (the first: %s: %s): they become dead letters and the "
                            "batch is written again without them", table, len(found), where, first.error)
                parsed = mark_refused(parsed, found, table)
        raise BadRecordError(f"table {role(sink, RowRefusals).output_table} still refused rows after "
                             f"{REFUSAL_ROUNDS} rounds of finding them: nothing was committed")

    def _apply_transformed_changes(self, spark: SparkSession, parsed: DataFrame, payload: list[str],
                                   batch: BatchContext, sink: Sink) -> ExecutionResult:
        """:meth:`_apply_changes` of the transform's output (:func:`~airflow_eo.spark.changes.transform_changes`),
        by an engine without the transform: a row the table refuses then fails the batch (a transformed row is not
        one record). Every record read counts, those the transform dropped too (a job of its own)."""
        keys = (role(sink, ChangeMerges, "changes") if has_role(sink, ChangeMerges)
                else role(sink, ChangePositions, "changes")).key_columns
        changes, columns = transform_changes(parsed, payload, keys,
                                             lambda seen: self._apply_transform(spark, seen, batch),
                                             metadata_columns(self.parse))
        result = replace(self, transform=None, rows_transformed=True)._apply_changes(spark, changes, columns, batch,
                                                                                       sink)
        return replace(result, records_in=_count(parsed)[0])

    def _apply_changes(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                       sink: Sink) -> ExecutionResult:
        """A change stream's batch (:mod:`airflow_eo.core.changes`): per key, the newest change by source position,
        when newer than the position the sink recorded for the key, is written (an upsert of its row, or a delete);
        then the positions of what was written, in the sink's change-position table (each task its own branch /
        fenced transaction, after the output's: a position is never recorded without its write). Kept by Spark
        between the two jobs, so the records are read and decided once. A table format (``merges_changes``) does all
        of it in its own commit (``airflow_eo/lakehouse/changes.py``): one job reads, checks and hands it the rows."""
        from pyspark import StorageLevel
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if has_role(sink, ChangeMerges):  # a table format: positions and deletes go with its own commit
            merges = role(sink, ChangeMerges, "changes")
            return self._write_failing_on_bad_records(parsed, [*payload, POSITION_COLUMN, CHANGED_AT], batch, sink,
                                                      keep=~F.col(SKIP), write=merges.write_changes)
        changes = role(sink, ChangePositions, "changes")
        t0 = time.monotonic()
        writer = changes.position_writer(batch)  # creates the table first: the look-ups read it
        if self.parse.on_truncate is TruncatePolicy.TRUNCATE:  # before the look-ups: they read its floor
            truncated = truncate_position(parsed)
            if truncated is not None and changes.truncate_target(batch, truncated):
                log.warning("changes: the source table was truncated (at position %s): the target's rows were "
                            "deleted; only changes newer than the truncate apply", truncated.hex())
        # Every record read counts (skipped ones and changes a newer one replaced too), counted by the job that
        # reads them.
        observation = Observation(f"airflow_eo_{uuid.uuid4().hex}")
        rows = parsed.observe(observation, *_record_counts()).where(~F.col(SKIP)).drop(SKIP)
        newest = newest_changes(with_key_ids(rows, changes.key_columns), changes.position_lookup(batch),
                                self.parse.write_partitions or _default_parallelism(spark))
        newest = newest.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            result = self._execute_around_refusals(spark, newest, payload, batch, sink)
            t1 = time.monotonic()
            written = self.run_partitions(WritePlan(position_rows(newest, batch.pipeline_id, batch.batch_id), self),
                                          PositionPartitions(writer))
            failpoint("after_change_positions", scope=f"{batch.pipeline_id}-{batch.batch_id}")
            log.info("changes: %s change(s) written, their positions recorded (%s)", result.rows_out, written.rows)
            purge_delete_markers(changes, batch.pipeline_id, PURGE_LIMIT)
            read = _observed_counts(observation)
            return ExecutionResult(records_in=result.records_in if read is None else read[0], rows_out=result.rows_out,
                                   dead_letters=result.dead_letters, duplicates=result.duplicates,
                                   xids=[*result.xids, *written.xids],
                                   seconds={**result.seconds, "changes": round(t1 - t0, 3),
                                            "change_positions": round(time.monotonic() - t1, 3)})
        finally:
            newest.unpersist()

    def _strategy(self, spark: SparkSession, parsed: DataFrame, payload: list[str], sink: Sink) -> WriteStrategy:
        # One pass or two, with a vote or not: core/write_strategy.py decides; Spark and the sink are asked
        # (lazily, in this order) only when the decision needs them.
        return choose_write_strategy(
            writes_visible_before_commit=sink.capabilities.writes_visible_before_commit,
            dead_letters=self.parse.on_bad_record is BadRecordPolicy.DEAD_LETTER,
            transform=self.transform is not None,
            barrier_possible=lambda: self._barrier_possible(spark),
            can_hold_writes=lambda: sink.can_hold_writes(parsed.select(*named_columns(payload))),
            commits_only_after_write_job=sink.capabilities.commits_only_after_write_job)

    def _execute(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                 sink: Sink) -> ExecutionResult:
        strategy = self._strategy(spark, parsed, payload, sink)
        if strategy is WriteStrategy.ONE_PASS:
            return self._write_then_validate(parsed, payload, batch, sink, vote=False)
        if strategy is WriteStrategy.VOTE:
            return self._write_then_validate(parsed, payload, batch, sink, vote=True)
        if strategy is WriteStrategy.ONE_PASS_TRANSFORMED:
            return self._transform_then_validate(spark, parsed, payload, batch, sink)
        if strategy is WriteStrategy.FAIL_IN_TASKS:
            return self._write_failing_on_bad_records(parsed, payload, batch, sink)
        return self._validate_then_write(spark, parsed, payload, batch, sink)  # WriteStrategy.TWO_PASS

    def _dedup_in_write_tasks(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                              sink: Sink) -> ExecutionResult | None:
        """The batch written by tasks that mark the copies themselves, when they can
        (:func:`~airflow_eo.core.dedup.marks_in_write_tasks`): one Spark job reads, spreads by id, looks up, writes the
        events and the ids seen first. None when they cannot, or when the table refused a row: then the copies are
        marked by a job of their own (:meth:`_mark_duplicates`) and the refused records found against the marked
        batch (what this write prepared is rolled back by the next write's tasks, as after any refusal)."""
        seen = role(sink, SeenIds, "dedup_key")  # refused at parse time; a sink built by hand is refused here
        strategy = self._strategy(spark, parsed, payload, sink)
        if not marks_in_write_tasks(self.parse.dedup_key, tuple(seen.key_columns),
                                    transform=self.transform is not None,
                                    one_pass=strategy in (WriteStrategy.ONE_PASS, WriteStrategy.VOTE)):
            return None
        dedup = TaskDedup(seen.seen_id_writer(batch), seen.seen_id_lookup(batch), self.parse.dedup_retention,
                          batch.pipeline_id, batch.batch_id, now_ms=int(time.time() * 1000))
        try:
            return self._write_then_validate(with_event_ids(parsed, self.parse.dedup_key), payload, batch, sink,
                                             vote=strategy is WriteStrategy.VOTE, dedup=dedup)
        except WriteRefused as refused:
            log.warning("table %s refused a row (%s): the copies are marked apart and the batch written again, to "
                        "find the records it refuses", sink.name, refused.error)
            return None

    def _purge_seen_ids(self, seen: SeenIds, pipeline_id: str, oldest_ms: int | None) -> None:
        """Remove the ids past retention, older than the batch's oldest record by more than it, until caught up."""
        if oldest_ms is None:
            return
        cutoff = purge_cutoff(oldest_ms, self.parse.dedup_retention)
        try:  # its own transactions: a purge that waits on another pipeline's locks costs this batch nothing else
            purged = purge_until_caught_up(lambda limit: seen.purge_seen_ids(pipeline_id, cutoff, limit), PURGE_LIMIT)
            if purged:
                log.info("dedup: %s event ids past retention removed", purged)
        except Exception:
            log.warning("dedup: could not remove event ids past retention (the next batch tries again)", exc_info=True)

    def _mark_duplicates(self, spark: SparkSession, parsed: DataFrame, batch: BatchContext,
                         sink: Sink) -> tuple[DataFrame, _Dedup]:
        """The parsed records marked as copies or first sightings (:mod:`airflow_eo.spark.dedup`), kept by Spark for
        the jobs that follow; the first sightings written to the sink's seen-id table (its own branches / fenced
        transactions per task, committed with the batch's output) after a bounded purge of ids past retention."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        seen = role(sink, SeenIds, "dedup_key")  # refused at parse time; a sink built by hand is refused here
        t0 = time.monotonic()
        writer = seen.seen_id_writer(batch)  # creates the table first: the look-ups read it
        retention = self.parse.dedup_retention
        partitions = self.parse.write_partitions or _default_parallelism(spark)
        now_ms = int(time.time() * 1000)  # no record's time is later (core.dedup.sighting_ms)
        marked = mark_duplicates(with_event_ids(parsed, self.parse.dedup_key), seen.seen_id_lookup(batch), retention,
                                 partitions, now_ms).persist(StorageLevel.MEMORY_AND_DISK)
        counts = marked.agg(F.sum(F.col(DUPLICATE).cast("long")).alias("duplicates"),
                            F.min(F.when(F.col(ID).isNotNull(), F.unix_millis(F.col("kafka_timestamp")))).alias(
                                "oldest")).collect()[0]
        duplicates = int(counts["duplicates"] or 0)
        t1 = time.monotonic()
        self._purge_seen_ids(seen, batch.pipeline_id,
                             None if counts["oldest"] is None else min(int(counts["oldest"]), now_ms))
        written = self.run_partitions(WritePlan(seen_id_rows(marked, batch.pipeline_id, batch.batch_id, now_ms), self),
                                      _SeenIdPartitions(writer))
        failpoint("after_seen_ids", scope=f"{batch.pipeline_id}-{batch.batch_id}")
        log.info("dedup: %s duplicate record(s) dropped, %s event id(s) seen first", duplicates, written.rows)
        return marked, _Dedup(duplicates, list(written.xids), {"dedup_mark": round(t1 - t0, 3),
                                                               "dedup_write": round(time.monotonic() - t1, 3)})

    def _validate_then_write(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                             sink: Sink) -> ExecutionResult:
        """Two passes: count the bad records first, then read again, transform and write.

        Reading the exact offset ranges again (read_committed) gives the same records; that costs less than caching
        every parsed record with its raw value (measured at 1,000,000 page views: 4.9 s to read, parse and count
        against 9.1 s to do so into a cache).
        """
        from pyspark.sql import functions as F

        t0 = time.monotonic()
        records_in, bad = _count(parsed)
        route = self._dead_letter_route(batch, sink) if bad else None
        # fail: raises here; dead letters without an executor-side writer: streamed through the driver
        dead_letters = self._bad_records(parsed, bad) if bad and route is None else iter(())
        good = parsed.where(F.col("_eo_error").isNull()).select(
            *named_columns([*payload, *metadata_columns(self.parse)]))
        out = self._apply_transform(spark, good, batch)
        seconds = {"read_transform": round(time.monotonic() - t0, 3)}
        t1 = time.monotonic()
        written = sink.write(WritePlan(out, self), batch)
        xids = list(written.xids)
        if route is not None:  # the executors write them: a job of their own, nothing through the driver
            xids += self._write_dead_letters(parsed, route).xids
        else:
            xids += sink.write_dead_letters(batch, dead_letters)
            if bad:
                seconds["dead_letters"] = round(time.monotonic() - t1, 3)  # through the driver (with the write)
        seconds["write"] = round(time.monotonic() - t1, 3)
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad, xids=xids,
                               seconds=seconds)

    def _transform_then_validate(self, spark: SparkSession, parsed: DataFrame, payload: list[str],
                                 batch: BatchContext, sink: Sink) -> ExecutionResult:
        """One pass with a transform in between (an aggregation, mostly), when finding a bad record after the write
        still commits nothing or bad records are not fatal: the write job counts the parsed records on its way
        (Spark's observed metrics, :attr:`WritePlan.observation`), and the bad records are read again only when
        there are some (to dead-letter them, or to name the first under ``on_bad_record="fail"``, after which the
        attempt discards what it wrote).

        Spark may count a task twice when it re-runs a lost stage: ``records_in`` is then too high (it is reported,
        never decided on); whether there is a bad record at all does not change, and the dead letters are written
        from the records themselves.
        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        t0 = time.monotonic()
        observation = Observation(f"airflow_eo_{uuid.uuid4().hex}")
        observed = parsed.observe(observation, *_record_counts())
        good = observed.where(F.col("_eo_error").isNull()).select(
            *named_columns([*payload, *metadata_columns(self.parse)]))
        out = self._apply_transform(spark, good, batch)
        written = sink.write(WritePlan(out, self, observation=observation), batch)
        seconds = {"write": round(time.monotonic() - t0, 3)}  # read, parse, transform and write: one Spark job
        t1 = time.monotonic()
        counted = written.counted
        if counted is None:  # the sink wrote without the partition writers (the Kafka sink): count now
            counted = _count(parsed)
            seconds["count"] = round(time.monotonic() - t1, 3)
        records_in, bad = counted
        xids = list(written.xids)
        if bad:
            t2 = time.monotonic()
            route = self._dead_letter_route(batch, sink)
            if route is not None:  # the executors write them: a job of their own, nothing through the driver
                xids += self._write_dead_letters(parsed, route).xids
            else:  # fail: raises, the attempt discards
                xids += sink.write_dead_letters(batch, self._bad_records(parsed, bad))
                seconds["dead_letters"] = round(time.monotonic() - t2, 3)  # through the driver
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad, xids=xids,
                               seconds=seconds)

    def _write_failing_on_bad_records(self, parsed: DataFrame, payload: list[str], batch: BatchContext, sink: Sink,
                                      keep: Column | None = None,
                                      write: Callable[[WritePlan, BatchContext], WriteResult] | None = None
                                      ) -> ExecutionResult:
        """One pass into a sink that commits only after its write job ran whole (a table format's commit): the job's
        first task that reads a bad record fails (Spark's ``raise_error``), so the job fails and the sink commits
        nothing; the records are counted on the job's way (observed metrics). Measured at 1,000,000 page views into
        Delta and Iceberg: the first pass of the two was 40 % of the batch. After the failure the batch is counted
        and the first bad record named, as the two passes do. ``keep``: the records that are rows (counted or not);
        ``write``: the sink's write of this output (default ``sink.write``)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        t0 = time.monotonic()
        observation = Observation(f"airflow_eo_{uuid.uuid4().hex}")
        where = F.concat(F.lit(f"{BAD_RECORD_MARK} "), F.col("kafka_topic"), F.lit("["),
                         F.col("kafka_partition").cast("string"), F.lit("] offset "),
                         F.col("kafka_offset").cast("string"), F.lit(": "), F.col("_eo_error"))
        observed = parsed.observe(observation, *_record_counts())
        if keep is not None:
            observed = observed.where(keep)
        good = observed.where(
            F.when(F.col("_eo_error").isNull(), F.lit(True)).otherwise(F.raise_error(where))).select(
            *named_columns(payload))  # no transform: the payload is the output
        try:
            written = (write or sink.write)(WritePlan(good, self, observation=observation), batch)
        except Exception as exc:
            if BAD_RECORD_MARK not in str(exc):
                raise
            _, bad = _count(parsed)
            if bad:
                for _ in self._bad_records(parsed, bad):  # raises, naming the first
                    pass
            raise  # no bad record now: the mark was in another failure's text
        seconds = {"write": round(time.monotonic() - t0, 3)}  # read, parse, check and write: one Spark job
        # No row written: the table had the batch (no job ran) or it was empty; else the job counted its records.
        counted = _observed_counts(observation) if written.rows else None
        if counted is None:
            t1 = time.monotonic()
            counted = _count(parsed)
            seconds["count"] = round(time.monotonic() - t1, 3)
        records_in, bad = counted
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad, xids=list(written.xids),
                               seconds=seconds)

    def _write_then_validate(self, parsed: DataFrame, payload: list[str], batch: BatchContext, sink: Sink,
                             vote: bool, dedup: TaskDedup | None = None) -> ExecutionResult:
        """One pass: every parsed record goes to the partition writers, which write the good ones and count the
        bad ones (the plan's ``counts_bad_records``, :meth:`run_partitions`); the bad records are read again only
        when there are some.

        Under ``on_bad_record="fail"`` a bad record raises after the write and before the commit point: the
        attempt's ``discard`` rolls back what was written (prepared branches, an open Kafka transaction). A sink
        whose writes are visible at once takes part only when its writers hold their partitions (``vote``): they
        write only after every task of the (barrier) stage has reported no bad record.

        With ``dedup`` (the parsed records carry ``_eo_id``), the tasks also drop the copies and write the ids they
        see first (:class:`~airflow_eo.core.batch.TaskDedup`).
        """
        from pyspark.sql import functions as F

        t0 = time.monotonic()
        route = self._dead_letter_route(batch, sink) if not vote else None
        bad_fields = [] if route is None else [
            F.when(F.col("_eo_error").isNotNull(), F.col(source)).alias(name)
            for name, source in _DEAD_LETTER_SOURCE.items()]
        unfiltered = parsed.select(*named_columns([*payload, "_eo_error"]), *bad_fields,
                                   *(position_columns() if dedup is not None else ()))
        good = unfiltered.where(F.col("_eo_error").isNull()).select(*named_columns(payload))
        written = sink.write(WritePlan(good, self, counts_bad_records=True, vote=vote, unfiltered=unfiltered,
                                       dead_letters=route, dedup=dedup), batch)
        seconds = {"write": round(time.monotonic() - t0, 3)}  # read, parse (mark) and write: one Spark job
        t1 = time.monotonic()
        if dedup is not None:
            self._purge_seen_ids(role(sink, SeenIds, "dedup_key"), batch.pipeline_id, written.oldest_ms)
            failpoint("after_seen_ids", scope=f"{batch.pipeline_id}-{batch.batch_id}")
            log.info("dedup: %s duplicate record(s) dropped by the write tasks", written.duplicates)
        counted = written.counted
        if counted is None:  # the sink wrote without the partition writers (the Kafka sink): count now
            counted = _count(parsed)
        records_in, bad = counted
        xids = list(written.xids)
        if bad and not written.dead_lettered:  # fail: raises, the attempt discards
            xids += sink.write_dead_letters(batch, self._bad_records(parsed, bad))
            seconds["dead_letters"] = round(time.monotonic() - t1, 3)  # through the driver
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad,
                               duplicates=written.duplicates, xids=xids, seconds=seconds)

    def _dead_letter_route(self, batch: BatchContext, sink: Sink) -> DeadLetterRoute | None:
        """The executors write the dead letters when the policy keeps them and the sink has a partition writer for
        them (:class:`~airflow_eo.core.protocol.ExecutorDeadLetters`); else they go through the driver."""
        if self.parse.on_bad_record is not BadRecordPolicy.DEAD_LETTER or not has_role(sink, DeadLetterTable):
            return None
        return DeadLetterRoute(role(sink, DeadLetterTable).dead_letter_writer(batch), batch.pipeline_id,
                               batch.batch_id)

    def _write_dead_letters(self, parsed: DataFrame, route: DeadLetterRoute) -> WriteResult:
        """The bad records into the dead-letter table by the executors, in a Spark job of their own (a batch with a
        transform, whose good rows' job never sees them); each task in its own branch / transaction."""
        from pyspark.sql import functions as F

        bad = parsed.where(F.col("_eo_error").isNotNull()).select(
            *[F.col(source).alias(name) for name, source in _DEAD_LETTER_SOURCE.items()], "_eo_error")
        return self.run_partitions(WritePlan(bad, self), _DeadLetterPartitions(route))

    def _bad_records(self, parsed: DataFrame, bad: int) -> Iterator[DeadLetter]:
        """The batch's bad records for the dead-letter table, streamed: the driver holds one partition of them at a
        time, whatever their number. Under ``on_bad_record="fail"`` raises at once, naming the first."""
        from pyspark.sql import functions as F

        rows = parsed.where(F.col("_eo_error").isNotNull()).orderBy("kafka_topic", "kafka_partition", "kafka_offset")
        if self.parse.on_bad_record is BadRecordPolicy.FAIL:
            first = rows.limit(1).collect()[0]
            raise BadRecordError(
                f"{bad} bad record(s) in this batch; the first: {first['kafka_topic']}[{first['kafka_partition']}] "
                f"offset {first['kafka_offset']}: {first['_eo_error']}. Nothing was committed. Fix the producer or "
                "the schema, or set on_bad_record='dead_letter' to divert bad records to the dead-letter table."
            )
        selected = rows.select("kafka_topic", "kafka_partition", "kafka_offset", "kafka_key", "kafka_value",
                               "_eo_error", "kafka_headers")
        return (DeadLetter(r[0], r[1], r[2], r[3], r[4], r[5],
                           tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r[6] or ()))
                for r in selected.toLocalIterator(prefetchPartitions=False))

    def _apply_transform(self, spark: SparkSession, good: DataFrame, batch: BatchContext) -> DataFrame:
        if self.transform is None:
            return good.drop(*metadata_columns(self.parse))
        if isinstance(self.transform, str):
            good.createOrReplaceTempView(BATCH_VIEW)
            return spark.sql(self.transform)
        return self.transform(good, batch)

    def _barrier_possible(self, spark: SparkSession) -> bool:
        """A barrier stage runs every writer task at once: a classic session without dynamic allocation, with at
        least as many task slots as writer tasks (Spark Connect: not known, so not tried)."""
        if is_connect(spark):
            return False
        conf = spark.sparkContext.getConf()
        if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true" or \
                conf.get("spark.task.cpus", "1") != "1":
            return False
        slots = _default_parallelism(spark)
        return (self.parse.write_partitions or slots) <= slots

    def run_partitions(self, plan: WritePlan, writer: PartitionWriter, columns: Sequence[str] | None = None
                       ) -> WriteResult:
        """``PartitionRunner``: every Spark task runs ``writer`` on its partition of ``plan.output`` (projected to
        ``columns``) and reports (xid, rows).

        When the plan counts bad records (a one-pass batch, :meth:`_write_then_validate`), the tasks get every
        record, hand the good ones to ``writer`` and count the bad ones, in the same job; when it votes, they run as
        a barrier stage and write only if no task counted a bad record.
        """
        from pyspark import BarrierTaskContext, TaskContext

        out = plan.output
        selected = list(columns) if columns is not None else list(out.columns)
        unknown = [c for c in selected if c not in out.columns]
        if unknown:
            raise ValueError(f"run_partitions: columns {unknown} are not columns of the output ({out.columns})")
        counting, hold, route, dedup = plan.counts_bad_records, plan.vote, plan.dead_letters, plan.dedup
        extra = ["_eo_error", *(_DEAD_LETTER_SOURCE if route is not None else ()),
                 *(MARKED_BY.values() if dedup is not None else ())]
        source = plan.unfiltered.select(*named_columns([*selected, *extra])) if counting else (
            out if columns is None else out.select(*named_columns(selected)))
        partitions = self.parse.write_partitions or _default_parallelism(out.sparkSession)
        # One key lives in one task: two XA branches never wait on each other's row locks. Bad records (NULL keys,
        # mostly) spread by their offsets instead of piling up in one task.
        spread = ["_eo_dl_partition", "_eo_dl_offset"] if route is not None else []
        # Marking copies in the task: every record of an id in one task (a key of the table is one id there).
        by = [ID] if dedup is not None else list(writer.key_columns)
        keyed, names = positional(source.repartition(partitions, *named_columns([*by, *spread])))
        marked_by = {role: names.index(column) for role, column in MARKED_BY.items()} if dedup is not None else {}

        def write_partition(renamed: Iterable[Any]) -> Iterator[Any]:
            import pyarrow as pa
            import pyarrow.compute as pc

            batches: Iterable[Any] = (batch.rename_columns(names) for batch in renamed)
            copies = TaskCopies()
            if dedup is not None:
                batches = copies.mark(batches, marked_by, dedup)

            ctx = BarrierTaskContext.get() if hold else TaskContext.get()
            assert ctx is not None, "mapInArrow runs this inside a Spark task"
            seen = {"records": copies.duplicates, "bad": 0}
            verdict: list[bool] = []
            counted = threading.Event()  # every record of the partition has gone by good_batches

            def agreed() -> bool:
                """Every task of the barrier stage calls this once; it votes when the task has counted its bad
                records (a writer may call it from another thread while it still reads its rows)."""
                if not verdict:
                    assert isinstance(ctx, BarrierTaskContext)
                    counted.wait()
                    verdict.append(sum(int(bad) for bad in ctx.allGather(str(seen["bad"]))) == 0)
                return verdict[0]

            spill = KeptBatches() if route is not None else None  # the bad records, off the heap

            def good_batches() -> Iterator[Any]:
                for batch in batches:
                    if counting:
                        bad = pc.is_valid(batch.column(batch.schema.get_field_index("_eo_error")))
                        bad_rows = pc.sum(bad).as_py() or 0
                        seen["records"] += batch.num_rows
                        seen["bad"] += bad_rows
                        if spill is not None and bad_rows:
                            spill.add(batch.filter(bad))
                        batch = batch.filter(pc.invert(bad)).drop_columns(extra)
                    yield batch
                counted.set()

            rows_in = good_batches()
            try:
                xid, rows = writer(rows_in, ctx.partitionId(), ctx.stageId(), ctx.taskAttemptId(),
                                   agreed if hold else None)
            except Exception as exc:
                raise_if_refused(writer, exc)  # marked: the driver finds the records the table refuses
                raise
            for _ in rows_in:  # a writer that stopped early: the rest of the partition is still counted
                pass
            if hold:
                agreed()  # a task with nothing to write still takes part in the vote
            if xid:
                failpoint("after_task_prepare", scope=f"{xid.split('/')[0]}-{ctx.partitionId()}")
            seen_xid = None
            if dedup is not None and copies.first_sightings is not None and copies.first_sightings.num_rows and (
                    not hold or agreed()):
                # The ids this task saw first, in its own branch / fenced transaction of the seen-id table.
                seen_xid, _ = _SeenIdPartitions(dedup.writer)(copies.first_sightings.to_batches(), ctx.partitionId(),
                                                              ctx.stageId(), ctx.taskAttemptId())
            dead_xid = None
            if spill is not None and route is not None:
                with spill:
                    # The bad records of this task, in its own branch / transaction of the dead-letter table.
                    dead_xid, dead_rows = route.writer(_dead_letter_batches(spill.batches(), route),
                                                       dead_letter_partition(ctx.partitionId()), ctx.stageId(),
                                                       ctx.taskAttemptId())
                if dead_rows:
                    failpoint("after_task_dead_letters", scope=f"{route.batch_id}-{ctx.partitionId()}")
            yield pa.RecordBatch.from_pydict(
                {"xid": [xid], "dead_xid": [dead_xid], "seen_xid": [seen_xid], "rows": [rows],
                 "records": [seen["records"]], "bad": [seen["bad"]], "duplicates": [copies.duplicates],
                 "oldest": [copies.oldest_ms]},
                schema=pa.schema([("xid", pa.string()), ("dead_xid", pa.string()), ("seen_xid", pa.string()),
                                  ("rows", pa.int64()), ("records", pa.int64()), ("bad", pa.int64()),
                                  ("duplicates", pa.int64()), ("oldest", pa.int64())]))

        try:
            reports = keyed.mapInArrow(write_partition,
                                       "xid string, dead_xid string, seen_xid string, rows long, records long, "
                                       "bad long, duplicates long, oldest long", barrier=hold).collect()
        except Exception as exc:
            refused = refused_write(writer, exc)
            if refused is not None:
                raise refused from exc
            raise
        counted = (sum(r["records"] for r in reports), sum(r["bad"] for r in reports)) if counting else \
            _observed_counts(plan.observation)
        xids = [x for r in reports for x in (r["xid"], r["dead_xid"], r["seen_xid"]) if x]
        oldest = [r["oldest"] for r in reports if r["oldest"] is not None]
        return WriteResult(xids, sum(r["rows"] for r in reports), counted, dead_lettered=route is not None,
                           duplicates=sum(r["duplicates"] for r in reports), oldest_ms=min(oldest, default=None))

    @contextlib.contextmanager
    def to_driver(self, plan: WritePlan, columns: Sequence[str]) -> Iterator[DriverStream]:
        """``PartitionRunner``: the output's ``columns`` to the driver, computed by one Spark job.

        The executors turn each Arrow batch of the output into an Arrow IPC stream and keep them on their local disks
        (``persist(DISK_ONLY)``), in a job that also counts the batch's records (observed metrics: the plan's
        observation, or one over the unfiltered records of a one-pass plan); the driver then reads them a partition
        at a time, the next one prefetched (``toLocalIterator``), and decodes a whole column at a time, never a Row
        per record. Compared with iterating the output straight from its plan, the batch is not read again just to
        count it (measured at 1,000,000 lines into the per-window counts: 9.75 s to iterate and count, 7.01 s this
        way). An executor lost meanwhile has its partitions computed again from the same offsets.
        """
        from pyspark import StorageLevel
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        def arrow_ipc_streams(batches: Iterable[Any]) -> Iterator[Any]:
            """Each Arrow batch of the task as one binary value, an Arrow IPC stream (runs in the Spark task; nested,
            so that it travels by value: a cluster's executors need no more than pyarrow for it)."""
            import pyarrow as pa

            for batch in batches:
                if batch.num_rows:
                    sink = pa.BufferOutputStream()
                    with pa.ipc.new_stream(sink, batch.schema) as writer:
                        writer.write_batch(batch)
                    yield pa.RecordBatch.from_pydict({"ipc": [sink.getvalue().to_pybytes()]},
                                                     schema=pa.schema([("ipc", pa.binary())]))

        observation = plan.observation
        output = plan.output.select(*named_columns(columns))
        if plan.counts_bad_records:
            observation = Observation(f"airflow_eo_{uuid.uuid4().hex}")
            output = plan.unfiltered.observe(observation, *_record_counts()).where(
                F.col("_eo_error").isNull()).select(*named_columns(columns))
        streams = positional(output)[0].mapInArrow(arrow_ipc_streams, "ipc binary").persist(StorageLevel.DISK_ONLY)
        try:
            streams.write.format("noop").mode("overwrite").save()  # the one job: every partition onto its disk
            yield DriverStream(_ipc_batches(streams, columns), _observed_counts(observation))
        finally:
            streams.unpersist()

    def cancel(self) -> None:
        """Interrupt this batch's running Spark jobs (``on_kill``)."""
        if self._spark is not None and self._job_tag:
            self._spark.interruptTag(self._job_tag)


@dataclass(frozen=True)
class _Dedup:
    """What marking a batch's duplicates did: the copies dropped, the seen-id branches written, the seconds."""

    duplicates: int
    xids: list[str]
    seconds: dict[str, float]

    def into(self, result: ExecutionResult) -> ExecutionResult:
        """``result`` of the deduplicated records, with the copies counted in (they were read) and the seen-id
        branches committed with the output's."""
        return ExecutionResult(records_in=result.records_in + self.duplicates, rows_out=result.rows_out,
                               dead_letters=result.dead_letters, duplicates=self.duplicates,
                               xids=[*self.xids, *result.xids], seconds={**self.seconds, **result.seconds})


@dataclass(frozen=True)
class _SeenIdPartitions:
    """The seen-id table's writer run as a job's partition writer, numbered as seen-id writers are
    (:func:`~airflow_eo.core.dedup.seen_id_partition`): its branches never take the place of the good rows' or the
    dead letters' of the same partition numbers."""

    writer: PartitionWriter

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(SEEN_ID_KEY)

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        import pyarrow as pa

        # In key order: the table's index takes them page after page instead of all over (ids are hashes).
        # Measured at 1,000,000 ids: 8.6 s unsorted.
        received = list(batches)
        ordered = pa.Table.from_batches(received).sort_by("event_id").to_batches() if received else []
        return self.writer(ordered, seen_id_partition(partition), stage_id, attempt_id, agreed)


@dataclass(frozen=True)
class _DeadLetterPartitions:
    """A dead-letter route's writer run as a job's partition writer, on the bad records' ``_DEAD_LETTER_SOURCE``
    columns (made into its batches as a one-pass task makes them, :func:`_dead_letter_batches`): numbered as
    dead-letter writers are (:func:`~airflow_eo.core.batch.dead_letter_partition`), so that its branches never
    take the place of (or roll back) the good rows' branches of the same partition numbers."""

    route: DeadLetterRoute

    @property
    def key_columns(self) -> tuple[str, ...]:
        return ("_eo_dl_topic", "_eo_dl_partition", "_eo_dl_offset")  # spread: every bad record is its own key

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        return self.route.writer(_dead_letter_batches(batches, self.route), dead_letter_partition(partition),
                                 stage_id, attempt_id, agreed)


def _dead_letter_batches(bad: Iterable[Any], route: DeadLetterRoute) -> Iterator[Any]:
    """The bad records as the dead-letter writer's batches (:data:`~airflow_eo.core.batch.DEAD_LETTER_FIELDS`),
    their headers encoded as the table keeps them (:func:`~airflow_eo.core.headers.encode_headers`)."""
    import pyarrow as pa

    for batch in bad:
        n = batch.num_rows
        column = {name: batch.column(batch.schema.get_field_index(name))
                  for name in (*_DEAD_LETTER_SOURCE, "_eo_error")}
        yield pa.RecordBatch.from_arrays(
            [pa.array([route.pipeline_id] * n, pa.string()), column["_eo_dl_topic"], column["_eo_dl_partition"],
             column["_eo_dl_offset"], pa.array([route.batch_id] * n, pa.int64()), column["_eo_dl_key"],
             column["_eo_dl_value"], column["_eo_error"],
             pa.array([NO_HEADERS if h is None else encode_header_structs(h)  # None: Spark's "no headers"
                       for h in column["_eo_dl_headers"].to_pylist()], pa.string())],
            names=list(DEAD_LETTER_FIELDS))


def _ipc_batches(streams: DataFrame, columns: Sequence[str]) -> Iterator[Any]:
    """The Arrow batches of :meth:`SparkBatchEngine.to_driver`'s IPC streams, with the output's column names, on the
    driver: the partition being read and the next one (prefetched while the sink works through this one, measured
    3.3 s -> 2.9 s for 750,000 records), never the whole batch."""
    import pyarrow as pa

    for row in streams.toLocalIterator(prefetchPartitions=True):
        for batch in pa.ipc.open_stream(row[0]):
            yield batch.rename_columns(list(columns))


def _record_counts() -> list[Any]:
    """The batch's records and bad records, as aggregate columns of the parsed records."""
    from pyspark.sql import functions as F

    return [F.count(F.lit(1)).alias("records"), F.count("_eo_error").alias("bad")]


def _count(parsed: DataFrame) -> tuple[int, int]:
    """``(records, bad records)`` of the parsed records, in a Spark job of its own."""
    row = parsed.agg(*_record_counts()).collect()[0]
    return int(row["records"]), int(row["bad"])


def _observed_counts(observation: Any) -> tuple[int, int] | None:
    """``(records, bad)`` observed by the job that just wrote a plan's output (:attr:`WritePlan.observation`), or
    None when that job did not run the observed records (a transform that ignored its input)."""
    if observation is None:
        return None
    from pyspark.errors import PySparkAssertionError

    java = getattr(observation, "_jo", None)
    if java is not None:
        # Classic: Observation.get waits, forever, for a job that ran the observed plan. Spark 4.0 completes it
        # before the job's action returns; a grace period covers a late listener, then we count instead of hanging.
        deadline = time.monotonic() + 10
        while not java.future().isCompleted():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
    try:
        metrics = observation.get  # Spark Connect: set by the action's response, else an error
    except PySparkAssertionError:
        return None
    if "records" not in metrics or "bad" not in metrics:
        # Spark Connect answers a write command (to_driver's noop write) without the observed metrics: not counted.
        return None
    return int(metrics["records"]), int(metrics["bad"])


def _default_parallelism(spark: SparkSession) -> int:
    """The cluster's task slots (classic session), or the shuffle partitions (Spark Connect has no SparkContext)."""
    if is_connect(spark):
        return max(1, int(spark.conf.get("spark.sql.shuffle.partitions") or 1))
    return max(1, spark.sparkContext.defaultParallelism)

