"""``dedup_key``'s two ways of dropping a batch's copies of events already seen: by the write tasks themselves, in
the write's one job (when they can: :func:`~airflow_eo.core.dedup.marks_in_write_tasks`), or by a marking job of
their own before the write, whose first sightings go to the sink's seen-id table.

Separate from the engine and from the marking itself (:mod:`airflow_eo.spark.dedup`, executor side) because it
chooses between the two and runs the jobs, with the write passes and the partition runner given to it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eo.core.abilities import SeenIds, role
from airflow_eo.core.batch import BatchContext, ExecutionResult, PartitionRunner, TaskDedup, WritePlan
from airflow_eo.core.config import ParseConfig
from airflow_eo.core.dedup import marks_in_write_tasks, sighting_ms
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.protocol import Sink
from airflow_eo.core.write_strategy import WriteStrategy
from airflow_eo.spark.dedup import (
    DUPLICATE,
    ID,
    SeenIdPartitions,
    mark_duplicates,
    purge_seen_ids,
    seen_id_rows,
    with_event_ids,
)
from airflow_eo.spark.partition_runner import default_parallelism
from airflow_eo.spark.refused_rows import WriteRefused
from airflow_eo.spark.write_passes import ChooseStrategy, WritePasses

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class DuplicateDropping:
    """A batch's copies of events already seen, dropped.

    :param parse: ``dedup_key``, its retention, the writer tasks.
    :param runner: runs the seen-id writers.
    :param passes: the one-pass write whose tasks drop the copies themselves.
    :param choose_strategy: the engine's question to the core: which write this batch gets.
    :param has_transform: the pipeline transforms its records (its tasks cannot tell a copy by the output's rows).
    """

    parse: ParseConfig
    runner: PartitionRunner
    passes: WritePasses
    choose_strategy: ChooseStrategy
    has_transform: bool

    def in_write_tasks(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                       sink: Sink) -> ExecutionResult | None:
        """The batch written by tasks that mark the copies themselves, when they can
        (:func:`~airflow_eo.core.dedup.marks_in_write_tasks`): one Spark job reads, spreads by id, looks up, writes the
        events and the ids seen first. None when they cannot, or when the table refused a row: then the copies are
        marked by a job of their own (:meth:`by_marking_job`) and the refused records found against the marked
        batch (what this write prepared rolled back first)."""
        seen = role(sink, SeenIds, "dedup_key")  # refused at parse time; a sink built by hand is refused here
        strategy = self.choose_strategy(spark, parsed, payload, sink)
        if not marks_in_write_tasks(self.parse.dedup_key, tuple(seen.key_columns),
                                    transform=self.has_transform,
                                    one_pass=strategy in (WriteStrategy.ONE_PASS, WriteStrategy.VOTE)):
            return None
        dedup = TaskDedup(seen.seen_id_writer(batch), seen.seen_id_lookup(batch), self.parse.dedup_retention,
                          batch.pipeline_id, batch.batch_id, now_ms=int(time.time() * 1000))
        try:
            return self.passes.write_then_validate(with_event_ids(parsed, self.parse.dedup_key), payload, batch,
                                                   sink, vote=strategy is WriteStrategy.VOTE, dedup=dedup)
        except WriteRefused as refused:
            log.warning("table %s refused a row (%s): the copies are marked apart and the batch written again, to "
                        "find the records it refuses", sink.name, refused.error)
            # Every branch this write's tasks prepared goes now: a task that prepared its seen ids before another
            # task's refusal failed the job holds their row locks, and the marking job spreads the ids over its tasks
            # otherwise (a task of another number, or one with nothing to write, rolls none of them back): its loads
            # of the same ids waited for the lock timeout and failed the batch.
            sink.discard(batch, [])
            return None

    def by_marking_job(self, spark: SparkSession, parsed: DataFrame, batch: BatchContext,
                       sink: Sink) -> tuple[DataFrame, MarkedDuplicates]:
        """The parsed records marked as copies or first sightings (:mod:`airflow_eo.spark.dedup`), kept by Spark for
        the jobs that follow; the first sightings written to the sink's seen-id table (its own branches / fenced
        transactions per task, committed with the batch's output) after a bounded purge of ids past retention."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        seen = role(sink, SeenIds, "dedup_key")  # refused at parse time; a sink built by hand is refused here
        t0 = time.monotonic()
        writer = seen.seen_id_writer(batch)  # creates the table first: the look-ups read it
        retention = self.parse.dedup_retention
        partitions = self.parse.write_partitions or default_parallelism(spark)
        now_ms = int(time.time() * 1000)  # no record's time is later (core.dedup.sighting_ms)
        marked = mark_duplicates(with_event_ids(parsed, self.parse.dedup_key), seen.seen_id_lookup(batch), retention,
                                 partitions, now_ms).persist(StorageLevel.MEMORY_AND_DISK)
        counts = marked.agg(F.sum(F.col(DUPLICATE).cast("long")).alias("duplicates"),
                            F.min(F.when(F.col(ID).isNotNull(), F.unix_millis(F.col("kafka_timestamp")))).alias(
                                "oldest")).collect()[0]
        duplicates = int(counts["duplicates"] or 0)
        t1 = time.monotonic()
        purge_seen_ids(seen, batch.pipeline_id,
                       None if counts["oldest"] is None else sighting_ms(int(counts["oldest"]), now_ms, retention),
                       retention)
        written = self.runner.run_partitions(
            WritePlan(seen_id_rows(marked, batch.pipeline_id, batch.batch_id, now_ms, retention), self.runner),
            SeenIdPartitions(writer))
        failpoint("after_seen_ids", scope=f"{batch.pipeline_id}-{batch.batch_id}")
        log.info("dedup: %s duplicate record(s) dropped, %s event id(s) seen first", duplicates, written.rows)
        return marked, MarkedDuplicates(duplicates, list(written.xids), {
            "dedup_mark": round(t1 - t0, 3), "dedup_write": round(time.monotonic() - t1, 3)})


@dataclass(frozen=True)
class MarkedDuplicates:
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
