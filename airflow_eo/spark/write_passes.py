"""The ways one batch is written (:class:`~airflow_eo.core.write_strategy.WriteStrategy`, chosen by the core): two
passes (count the bad records, then write), one pass whose partition writers count them (with or without the
barrier vote), one pass with a transform in between (the write job observes the counts), and one pass whose first
bad record fails the write job (a table format's commit).

Separate from the engine, which only asks the core which one and hands the batch over: each pass is a unit of its
own, with the partition runner, the dead-letter routes and the transform given to it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eo.core.abilities import SeenIds, role
from airflow_eo.core.batch import (
    BatchContext,
    ExecutionResult,
    PartitionRunner,
    TaskDedup,
    TaskPositions,
    WritePlan,
    WriteResult,
)
from airflow_eo.core.config import ParseConfig
from airflow_eo.core.failpoints import failpoint
from airflow_eo.core.protocol import Sink
from airflow_eo.core.write_strategy import WriteStrategy
from airflow_eo.spark.change_positions import task_position_columns
from airflow_eo.spark.columns import named_columns
from airflow_eo.spark.dead_letter_routes import DEAD_LETTER_SOURCE, DeadLetterRoutes
from airflow_eo.spark.dedup import position_columns, purge_seen_ids
from airflow_eo.spark.parsing import metadata_columns
from airflow_eo.spark.record_counts import count_records, observed_counts, record_counts
from airflow_eo.spark.transforms import ApplyTransform

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The write strategy the core chooses for a batch ``(spark, parsed, payload, sink)`` (the engine's question).
ChooseStrategy = Callable[["SparkSession", "DataFrame", list[str], Sink], WriteStrategy]


#: Begins the error a write task raises on a bad record (:meth:`WritePasses.write_failing_on_bad_records`).
BAD_RECORD_MARK = "airflow_eo: bad record at"


@dataclass(frozen=True)
class WritePasses:
    """The write strategies of a batch, each a method.

    :param parse: how records become rows (the bad-record policy, dedup).
    :param runner: runs the sinks' partition writers.
    :param dead_letters: where the bad records go.
    :param apply_transform: the pipeline's transform of the good records ``(spark, good, batch) -> output``.
    """

    parse: ParseConfig
    runner: PartitionRunner
    dead_letters: DeadLetterRoutes
    apply_transform: ApplyTransform

    def validate_then_write(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                            sink: Sink) -> ExecutionResult:
        """Two passes: count the bad records first, then read again, transform and write.

        Reading the exact offset ranges again (read_committed) gives the same records; that costs less than caching
        every parsed record with its raw value (measured at 1,000,000 page views: 4.9 s to read, parse and count
        against 9.1 s to do so into a cache).
        """
        from pyspark.sql import functions as F

        t0 = time.monotonic()
        records_in, bad = count_records(parsed)
        route = self.dead_letters.route(batch, sink) if bad else None
        # fail: raises here; dead letters without an executor-side writer: streamed through the driver
        dead_letters = self.dead_letters.bad_records(parsed, bad) if bad and route is None else iter(())
        good = parsed.where(F.col("_eo_error").isNull()).select(
            *named_columns([*payload, *metadata_columns(self.parse)]))
        out = self.apply_transform(spark, good, batch)
        seconds = {"read_transform": round(time.monotonic() - t0, 3)}
        t1 = time.monotonic()
        written = sink.write(WritePlan(out, self.runner), batch)
        xids = list(written.xids)
        if route is not None:  # the executors write them: a job of their own, nothing through the driver
            xids += self.dead_letters.write(parsed, route).xids
        else:
            xids += sink.write_dead_letters(batch, dead_letters)
            if bad:
                seconds["dead_letters"] = round(time.monotonic() - t1, 3)  # through the driver (with the write)
        seconds["write"] = round(time.monotonic() - t1, 3)
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad, xids=xids,
                               seconds=seconds)

    def transform_then_validate(self, spark: SparkSession, parsed: DataFrame, payload: list[str],
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
        observed = parsed.observe(observation, *record_counts())
        good = observed.where(F.col("_eo_error").isNull()).select(
            *named_columns([*payload, *metadata_columns(self.parse)]))
        out = self.apply_transform(spark, good, batch)
        written = sink.write(WritePlan(out, self.runner, observation=observation), batch)
        seconds = {"write": round(time.monotonic() - t0, 3)}  # read, parse, transform and write: one Spark job
        t1 = time.monotonic()
        counted = written.counted
        if counted is None:  # the sink wrote without the partition writers (the Kafka sink): count now
            counted = count_records(parsed)
            seconds["count"] = round(time.monotonic() - t1, 3)
        records_in, bad = counted
        xids = list(written.xids)
        if bad:
            t2 = time.monotonic()
            route = self.dead_letters.route(batch, sink)
            if route is not None:  # the executors write them: a job of their own, nothing through the driver
                xids += self.dead_letters.write(parsed, route).xids
            else:  # fail: raises, the attempt discards
                xids += sink.write_dead_letters(batch, self.dead_letters.bad_records(parsed, bad))
                seconds["dead_letters"] = round(time.monotonic() - t2, 3)  # through the driver
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad, xids=xids,
                               seconds=seconds)

    def write_failing_on_bad_records(self, parsed: DataFrame, payload: list[str], batch: BatchContext, sink: Sink,
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
        observed = parsed.observe(observation, *record_counts())
        if keep is not None:
            observed = observed.where(keep)
        good = observed.where(
            F.when(F.col("_eo_error").isNull(), F.lit(True)).otherwise(F.raise_error(where))).select(
            *named_columns(payload))  # no transform: the payload is the output
        try:
            written = (write or sink.write)(WritePlan(good, self.runner, observation=observation), batch)
        except Exception as exc:
            if BAD_RECORD_MARK not in str(exc):
                raise
            _, bad = count_records(parsed)
            if bad:
                for _ in self.dead_letters.bad_records(parsed, bad):  # raises, naming the first
                    pass
            raise  # no bad record now: the mark was in another failure's text
        seconds = {"write": round(time.monotonic() - t0, 3)}  # read, parse, check and write: one Spark job
        # No row written: the table had the batch (no job ran) or it was empty; else the job counted its records.
        counted = observed_counts(observation) if written.rows else None
        if counted is None:
            t1 = time.monotonic()
            counted = count_records(parsed)
            seconds["count"] = round(time.monotonic() - t1, 3)
        records_in, bad = counted
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad, xids=list(written.xids),
                               seconds=seconds)

    def write_then_validate(self, parsed: DataFrame, payload: list[str], batch: BatchContext, sink: Sink,
                            vote: bool, dedup: TaskDedup | None = None,
                            positions: TaskPositions | None = None) -> ExecutionResult:
        """One pass: every parsed record goes to the partition writers, which write the good ones and count the
        bad ones (the plan's ``counts_bad_records``,
        :meth:`~airflow_eo.spark.partition_runner.SparkPartitionRunner.run_partitions`); the bad records are read
        again only when there are some.

        Under ``on_bad_record="fail"`` a bad record raises after the write and before the commit point: the
        attempt's ``discard`` rolls back what was written (prepared branches, an open Kafka transaction). A sink
        whose writes are visible at once takes part only when its writers hold their partitions (``vote``): they
        write only after every task of the (barrier) stage has reported no bad record.

        With ``dedup`` (the parsed records carry ``_eo_id``), the tasks also drop the copies and write the ids they
        see first (:class:`~airflow_eo.core.batch.TaskDedup`). With ``positions`` (the parsed records are a change
        stream's newest changes), the tasks also record the positions of the changes they wrote
        (:class:`~airflow_eo.core.batch.TaskPositions`).
        """
        from pyspark.sql import functions as F

        t0 = time.monotonic()
        route = self.dead_letters.route(batch, sink) if not vote else None
        bad_fields = [] if route is None else [
            F.when(F.col("_eo_error").isNotNull(), F.col(source)).alias(name)
            for name, source in DEAD_LETTER_SOURCE.items()]
        unfiltered = parsed.select(*named_columns([*payload, "_eo_error"]), *bad_fields,
                                   *(position_columns() if dedup is not None else ()),
                                   *(task_position_columns() if positions is not None else ()))
        good = unfiltered.where(F.col("_eo_error").isNull()).select(*named_columns(payload))
        written = sink.write(WritePlan(good, self.runner, counts_bad_records=True, vote=vote, unfiltered=unfiltered,
                                       dead_letters=route, dedup=dedup, positions=positions), batch)
        seconds = {"write": round(time.monotonic() - t0, 3)}  # read, parse (mark) and write: one Spark job
        t1 = time.monotonic()
        if dedup is not None:
            purge_seen_ids(role(sink, SeenIds, "dedup_key"), batch.pipeline_id, written.oldest_ms,
                           self.parse.dedup_retention)
            failpoint("after_seen_ids", scope=f"{batch.pipeline_id}-{batch.batch_id}")
            log.info("dedup: %s duplicate record(s) dropped by the write tasks", written.duplicates)
        counted = written.counted
        if counted is None:  # the sink wrote without the partition writers (the Kafka sink): count now
            counted = count_records(parsed)
        records_in, bad = counted
        xids = list(written.xids)
        if bad and not written.dead_lettered:  # fail: raises, the attempt discards
            xids += sink.write_dead_letters(batch, self.dead_letters.bad_records(parsed, bad))
            seconds["dead_letters"] = round(time.monotonic() - t1, 3)  # through the driver
        return ExecutionResult(records_in=records_in, rows_out=written.rows, dead_letters=bad,
                               duplicates=written.duplicates, xids=xids, seconds=seconds)
