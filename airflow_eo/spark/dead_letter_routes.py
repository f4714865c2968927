"""Where a batch's bad records go under ``on_bad_record="dead_letter"``: written by the executors into the sink's
dead-letter table (a route the one-pass writers take, or a job of their own), or streamed through the driver; under
``on_bad_record="fail"``, the first one named.

Separate from the engine because every write pass routes its bad records the same way, and the partition runner's
tasks write them with the same batches (:func:`dead_letter_batches`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_eo.core.abilities import DeadLetterTable, has_role, role
from airflow_eo.core.batch import (
    DEAD_LETTER_FIELDS,
    BatchContext,
    DeadLetter,
    DeadLetterRoute,
    PartitionRunner,
    WritePlan,
    WriteResult,
    dead_letter_partition,
)
from airflow_eo.core.config import BadRecordPolicy
from airflow_eo.core.errors import BadRecordError
from airflow_eo.core.headers import NO_HEADERS, encode_header_structs
from airflow_eo.core.protocol import Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: What a one-pass batch's partition writers get of a bad record besides its error (NULL on good records, so that
#: the good ones carry next to nothing more through the shuffle): the dead-letter fields, by their source columns.
DEAD_LETTER_SOURCE = {"_eo_dl_topic": "kafka_topic", "_eo_dl_partition": "kafka_partition",
                       "_eo_dl_offset": "kafka_offset", "_eo_dl_key": "kafka_key", "_eo_dl_value": "kafka_value",
                       "_eo_dl_headers": "kafka_headers"}


@dataclass(frozen=True)
class DeadLetterRoutes:
    """A batch's bad records, routed by the pipeline's policy and the sink's abilities.

    :param on_bad_record: the pipeline's policy.
    :param runner: runs a route's writer in Spark tasks.
    """

    on_bad_record: BadRecordPolicy
    runner: PartitionRunner

    def route(self, batch: BatchContext, sink: Sink) -> DeadLetterRoute | None:
        """The executors write the dead letters when the policy keeps them and the sink has a partition writer for
        them (:class:`~airflow_eo.core.protocol.ExecutorDeadLetters`); else they go through the driver."""
        if self.on_bad_record is not BadRecordPolicy.DEAD_LETTER or not has_role(sink, DeadLetterTable):
            return None
        return DeadLetterRoute(role(sink, DeadLetterTable).dead_letter_writer(batch), batch.pipeline_id,
                               batch.batch_id)

    def write(self, parsed: DataFrame, route: DeadLetterRoute) -> WriteResult:
        """The bad records into the dead-letter table by the executors, in a Spark job of their own (a batch with a
        transform, whose good rows' job never sees them); each task in its own branch / transaction."""
        from pyspark.sql import functions as F

        bad = parsed.where(F.col("_eo_error").isNotNull()).select(
            *[F.col(source).alias(name) for name, source in DEAD_LETTER_SOURCE.items()], "_eo_error")
        return self.runner.run_partitions(WritePlan(bad, self.runner), DeadLetterPartitions(route))

    def bad_records(self, parsed: DataFrame, bad: int) -> Iterator[DeadLetter]:
        """The batch's bad records for the dead-letter table, streamed: the driver holds one partition of them at a
        time, whatever their number. Under ``on_bad_record="fail"`` raises at once, naming the first."""
        from pyspark.sql import functions as F

        rows = parsed.where(F.col("_eo_error").isNotNull()).orderBy("kafka_topic", "kafka_partition", "kafka_offset")
        if self.on_bad_record is BadRecordPolicy.FAIL:
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


@dataclass(frozen=True)
class DeadLetterPartitions:
    """A dead-letter route's writer run as a job's partition writer, on the bad records' ``DEAD_LETTER_SOURCE``
    columns (made into its batches as a one-pass task makes them, :func:`dead_letter_batches`): numbered as
    dead-letter writers are (:func:`~airflow_eo.core.batch.dead_letter_partition`), so that its branches never
    take the place of (or roll back) the good rows' branches of the same partition numbers."""

    route: DeadLetterRoute

    @property
    def key_columns(self) -> tuple[str, ...]:
        return ("_eo_dl_topic", "_eo_dl_partition", "_eo_dl_offset")  # spread: every bad record is its own key

    def __call__(self, batches: Iterable[Any], partition: int, stage_id: int, attempt_id: int,
                 agreed: Callable[[], bool] | None = None) -> tuple[str | None, int]:
        return self.route.writer(dead_letter_batches(batches, self.route), dead_letter_partition(partition),
                                 stage_id, attempt_id, agreed)


def dead_letter_batches(bad: Iterable[Any], route: DeadLetterRoute) -> Iterator[Any]:
    """The bad records as the dead-letter writer's batches (:data:`~airflow_eo.core.batch.DEAD_LETTER_FIELDS`),
    their headers encoded as the table keeps them (:func:`~airflow_eo.core.headers.encode_headers`)."""
    import pyarrow as pa

    for batch in bad:
        n = batch.num_rows
        column = {name: batch.column(batch.schema.get_field_index(name))
                  for name in (*DEAD_LETTER_SOURCE, "_eo_error")}
        yield pa.RecordBatch.from_arrays(
            [pa.array([route.pipeline_id] * n, pa.string()), column["_eo_dl_topic"], column["_eo_dl_partition"],
             column["_eo_dl_offset"], pa.array([route.batch_id] * n, pa.int64()), column["_eo_dl_key"],
             column["_eo_dl_value"], column["_eo_error"],
             pa.array([NO_HEADERS if h is None else encode_header_structs(h)  # None: Spark's "no headers"
                       for h in column["_eo_dl_headers"].to_pylist()], pa.string())],
            names=list(DEAD_LETTER_FIELDS))
