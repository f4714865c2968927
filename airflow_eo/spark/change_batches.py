"""A change stream's batch (``changes="debezium"``): per key, the newest change newer than the sink's row is written
(an upsert of its row, or a delete), then the positions of what was written; a table format does all of it in its
own commit. With a transform, the transform's output is applied by an engine without it.

Separate from the engine because it routes a batch its own way (positions, truncates, delete markers) before and
after the write pass, with the write passes, the refusal rounds and the partition runner given to it.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from airflow_eo.core.abilities import ChangeMerges, ChangePositions, has_role, role
from airflow_eo.core.batch import (
    BatchContext,
    ExecutionResult,
    PartitionRunner,
    PartitionWriter,
    TaskPositions,
    WritePlan,
)
from airflow_eo.core.changes import CHANGED_AT, POSITION_COLUMN, TruncatePolicy
from airflow_eo.core.config import ParseConfig
from airflow_eo.core.dedup import PURGE_LIMIT
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.protocol import Sink
from airflow_eo.core.write_strategy import WriteStrategy
from airflow_eo.spark.change_positions import PositionPartitions, position_rows, purge_delete_markers
from airflow_eo.spark.change_transforms import transform_changes
from airflow_eo.spark.changes import SKIP, newest_changes, truncate_position
from airflow_eo.spark.parsing import metadata_columns
from airflow_eo.spark.partition_runner import default_parallelism
from airflow_eo.spark.record_counts import count_records, observed_counts, record_counts
from airflow_eo.spark.refusal_rounds import RefusalRounds
from airflow_eo.spark.refused_rows import without_raw_fields
from airflow_eo.spark.transforms import ApplyTransform
from airflow_eo.spark.write_passes import ChooseStrategy, WritePasses

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedPositions:
    """The positions' own branches / transactions (none when the write tasks recorded them), and their seconds."""

    xids: list[str]
    seconds: dict[str, float]


@dataclass(frozen=True)
class ChangeBatches:
    """A change stream's batches.

    :param parse: the change options (``on_truncate``), the writer tasks.
    :param runner: runs the change-position writers.
    :param passes: the write that fails on a bad record (a table format's MERGE of the changes).
    :param rounds: the write around refused rows (the changes' rows into a SQL table).
    :param apply_transform: the pipeline's transform ``(spark, records, batch) -> output``.
    :param choose_strategy: the engine's question to the core: which write this batch gets.
    """

    parse: ParseConfig
    runner: PartitionRunner
    passes: WritePasses
    rounds: RefusalRounds
    apply_transform: ApplyTransform
    choose_strategy: ChooseStrategy

    def apply(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
              sink: Sink) -> ExecutionResult:
        """A change stream's batch (:mod:`airflow_eo.core.changes`): per key, the newest change by source position,
        when newer than the position the sink recorded for the key, is written (an upsert of its row, or a delete);
        then the positions of what was written, in the sink's change-position table (each task its own branch /
        fenced transaction, after the output's: a position is never recorded without its write), by the write
        tasks themselves when the batch is written in one pass, else by a job of its own (the changes are kept by
        Spark between the two jobs, so the records are read and decided once). A table format
        (``merges_changes``) does all of it in its own commit (``airflow_eo/lakehouse/changes.py``): one job reads,
        checks and hands it the rows."""
        from pyspark import StorageLevel
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if has_role(sink, ChangeMerges):  # a table format: positions and deletes go with its own commit
            merges = role(sink, ChangeMerges, "changes")
            return self.passes.write_failing_on_bad_records(parsed, [*payload, POSITION_COLUMN, CHANGED_AT], batch,
                                                            sink, keep=~F.col(SKIP), write=merges.write_changes)
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
        rows = parsed.observe(observation, *record_counts()).where(~F.col(SKIP)).drop(SKIP)
        # Spread by key without the good records' raw values: most of them are older changes, never written.
        newest = newest_changes(without_raw_fields(rows), changes.key_columns, changes.position_lookup(batch),
                                self.parse.write_partitions or default_parallelism(spark))
        newest = newest.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            strategy = self.choose_strategy(spark, newest, payload, sink)
            if strategy in (WriteStrategy.ONE_PASS, WriteStrategy.VOTE):  # the write tasks record the positions
                in_tasks = TaskPositions(writer, batch.pipeline_id, batch.batch_id)
                result, positions = self._written_with_positions(spark, newest, parsed, payload, batch, sink,
                                                                 in_tasks, vote=strategy is WriteStrategy.VOTE)
            else:
                result, positions = self._written_then_positions(spark, newest, parsed, payload, batch, sink, writer)
            failpoint("after_change_positions", scope=f"{batch.pipeline_id}-{batch.batch_id}")
            purge_delete_markers(changes, batch.pipeline_id, PURGE_LIMIT)
            read = observed_counts(observation)
            return ExecutionResult(records_in=result.records_in if read is None else read[0], rows_out=result.rows_out,
                                   dead_letters=result.dead_letters, duplicates=result.duplicates,
                                   xids=[*result.xids, *positions.xids],
                                   seconds={**result.seconds, **positions.seconds,
                                            "changes": round(time.monotonic() - t0, 3)})
        finally:
            newest.unpersist()

    def _written_with_positions(self, spark: SparkSession, newest: DataFrame, parsed: DataFrame, payload: list[str],
                                batch: BatchContext, sink: Sink, positions: TaskPositions, vote: bool
                                ) -> tuple[ExecutionResult, RecordedPositions]:
        """The newest changes written in one pass, whose tasks record the positions of what they wrote (their
        branches are among the result's)."""
        result, _ = self.rounds.written(
            spark, newest, payload, batch, sink, originals=parsed,
            write_once=lambda _spark, rows, columns, context, target: self.passes.write_then_validate(
                rows, columns, context, target, vote=vote, positions=positions))
        log.info("changes: %s change(s) written, their positions recorded by the write tasks", result.rows_out)
        return result, RecordedPositions([], {})

    def _written_then_positions(self, spark: SparkSession, newest: DataFrame, parsed: DataFrame, payload: list[str],
                                batch: BatchContext, sink: Sink, writer: PartitionWriter
                                ) -> tuple[ExecutionResult, RecordedPositions]:
        """The newest changes written by the engine's write, then the positions of those written (a refused one's is
        not) by a job of their own."""
        result, applied = self.rounds.written(spark, newest, payload, batch, sink, originals=parsed)
        t0 = time.monotonic()
        written = self.runner.run_partitions(
            WritePlan(position_rows(applied, batch.pipeline_id, batch.batch_id), self.runner),
            PositionPartitions(writer))
        log.info("changes: %s change(s) written, their positions recorded (%s)", result.rows_out, written.rows)
        return result, RecordedPositions(list(written.xids), {"change_positions": round(time.monotonic() - t0, 3)})

    def apply_transformed(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                          sink: Sink, untransformed: ChangeBatches) -> ExecutionResult:
        """:meth:`apply` of the transform's output (:func:`~airflow_eo.spark.change_transforms.transform_changes`), by
        ``untransformed`` (an engine's without the transform): a row the table refuses then fails the batch (a
        transformed row is not one record). Every record read counts, those the transform dropped too (a job of
        its own)."""
        keys = (role(sink, ChangeMerges, "changes") if has_role(sink, ChangeMerges)
                else role(sink, ChangePositions, "changes")).key_columns
        changes, columns = transform_changes(parsed, payload, keys,
                                             lambda seen: self.apply_transform(spark, seen, batch),
                                             metadata_columns(self.parse))
        result = untransformed.apply(spark, changes, columns, batch, sink)
        return replace(result, records_in=count_records(parsed)[0])
