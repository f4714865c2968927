"""Spark execution of one planned batch: read exact ranges, parse, transform, write per partition.

The Kafka read uses Spark's own Kafka source with ``read_committed`` and the batch's
exact ``startingOffsets``/``endingOffsets``. Parsing (``spark/parsing.py``) marks bad records (null value,
malformed JSON, wrong types, missing required fields) instead of dropping them;
``on_bad_record`` decides whether the batch fails or dead-letters them. The sink's
:class:`PartitionWriter` runs inside ``mapInArrow`` so each Spark task writes its
partition from Arrow batches and reports ``(xid, rows)`` to the driver: the engine is the
sinks' :class:`~airflow_eo.core.batch.PartitionRunner`.

The engine orchestrates; each concern is a collaborator it makes from its configuration and hands what it needs:
the partition runner (``partition_runner.py``), the dead-letter routes (``dead_letter_routes.py``), the write passes
the core chooses between (``write_passes.py``), the rounds around rows a table refuses (``refusal_rounds.py``),
dropping copies (``duplicate_dropping.py``) and a change stream's batches (``change_batches.py``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_eo.core.batch import BatchContext, DriverStream, ExecutionResult, PartitionWriter, WritePlan, WriteResult
from airflow_eo.core.config import BadRecordPolicy, ParseConfig
from airflow_eo.core.protocol import Sink
from airflow_eo.core.ranges import spark_offsets
from airflow_eo.core.write_strategy import WriteStrategy, choose_write_strategy
from airflow_eo.spark.change_batches import ChangeBatches
from airflow_eo.spark.columns import named_columns
from airflow_eo.spark.dead_letter_routes import DeadLetterRoutes
from airflow_eo.spark.dedup import DUPLICATE, ID, NEW
from airflow_eo.spark.duplicate_dropping import DuplicateDropping
from airflow_eo.spark.kafka_security import spark_kafka_options
from airflow_eo.spark.parsing import metadata_columns, parse_records
from airflow_eo.spark.partition_runner import SparkPartitionRunner, barrier_possible
from airflow_eo.spark.refusal_rounds import RefusalRounds
from airflow_eo.spark.transforms import Transform, apply_transform, resolve_transform
from airflow_eo.spark.value_checks import refuse_unstorable
from airflow_eo.spark.write_passes import WritePasses

# A batch reads ranges whose records exist: a broker that waits for more (fetch.max.wait.ms, 500 ms by default) only
# delays each task's last fetch. Measured: 1,000 partitions of 20 records read in 270 s at the default, 20 s at 10 ms;
# three partitions of a million in 2.9 s and 2.0 s (docs/explanation/benchmark.md, "Breadth"). ``kafka_options`` may
# set it again.
FETCH_MAX_WAIT_MS = 10

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
    # The collaborators, made from the configuration above (again by dataclasses.replace).
    runner: SparkPartitionRunner = field(init=False, repr=False, compare=False)
    dead_letters: DeadLetterRoutes = field(init=False, repr=False, compare=False)
    passes: WritePasses = field(init=False, repr=False, compare=False)
    rounds: RefusalRounds = field(init=False, repr=False, compare=False)
    duplicates: DuplicateDropping = field(init=False, repr=False, compare=False)
    changes: ChangeBatches = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.transform = resolve_transform(self.transform)
        spark_kafka_options(self.kafka_config, self.kafka_options)  # refused here, before any side effect
        self.runner = SparkPartitionRunner(self.parse.write_partitions)
        self.dead_letters = DeadLetterRoutes(self.parse.on_bad_record, self.runner)
        self.passes = WritePasses(self.parse, self.runner, self.dead_letters, self._apply_transform)
        self.rounds = RefusalRounds(self.parse, self.transform is not None or self.rows_transformed, self._execute)
        self.duplicates = DuplicateDropping(self.parse, self.runner, self.passes, self._strategy,
                                            has_transform=self.transform is not None)
        self.changes = ChangeBatches(self.parse, self.runner, self.passes, self.rounds, self._apply_transform,
                                     self._strategy)

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
                  .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
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
                    return self.changes.apply_transformed(spark, parsed, payload, batch, sink, replace(
                        self, transform=None, rows_transformed=True).changes)
                return self.changes.apply(spark, parsed, payload, batch, sink)
            if self.parse.dedup_key:  # copies of events already seen are dropped before anything else sees them
                in_tasks = self.duplicates.in_write_tasks(spark, parsed, payload, batch, sink)
                if in_tasks is not None:
                    return in_tasks
                marked, dedup = self.duplicates.by_marking_job(spark, parsed, batch, sink)
                parsed = marked.where(~marked[DUPLICATE]).drop(ID, DUPLICATE, NEW)
                return dedup.into(self.rounds.write(spark, parsed, payload, batch, sink))
            return self.rounds.write(spark, parsed, payload, batch, sink)
        finally:
            if marked is not None:
                marked.unpersist()
            spark.removeTag(self._job_tag)

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
            return self.passes.write_then_validate(parsed, payload, batch, sink, vote=False)
        if strategy is WriteStrategy.VOTE:
            return self.passes.write_then_validate(parsed, payload, batch, sink, vote=True)
        if strategy is WriteStrategy.ONE_PASS_TRANSFORMED:
            return self.passes.transform_then_validate(spark, parsed, payload, batch, sink)
        if strategy is WriteStrategy.FAIL_IN_TASKS:
            return self.passes.write_failing_on_bad_records(parsed, payload, batch, sink)
        return self.passes.validate_then_write(spark, parsed, payload, batch, sink)  # WriteStrategy.TWO_PASS

    def _apply_transform(self, spark: SparkSession, good: DataFrame, batch: BatchContext) -> DataFrame:
        return apply_transform(spark, good, batch, self.transform, metadata_columns(self.parse))

    def _barrier_possible(self, spark: SparkSession) -> bool:
        return barrier_possible(spark, self.parse.write_partitions)

    # ------------------------------------------------------------------ PartitionRunner

    def run_partitions(self, plan: WritePlan, writer: PartitionWriter, columns: Sequence[str] | None = None
                       ) -> WriteResult:
        """``PartitionRunner``: :meth:`SparkPartitionRunner.run_partitions
        <airflow_eo.spark.partition_runner.SparkPartitionRunner.run_partitions>`."""
        return self.runner.run_partitions(plan, writer, columns)

    @contextlib.contextmanager
    def to_driver(self, plan: WritePlan, columns: Sequence[str]) -> Iterator[DriverStream]:
        """``PartitionRunner``: :meth:`SparkPartitionRunner.to_driver
        <airflow_eo.spark.partition_runner.SparkPartitionRunner.to_driver>`."""
        with self.runner.to_driver(plan, columns) as stream:
            yield stream

    def cancel(self) -> None:
        """Interrupt this batch's running Spark jobs (``on_kill``)."""
        if self._spark is not None and self._job_tag:
            self._spark.interruptTag(self._job_tag)
