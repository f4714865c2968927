"""Rounds of a batch's write around the rows a table refuses only at the write (a constraint, a trigger): the
records it refuses are found by probes (:mod:`airflow_eo.spark.refused_rows`), become bad records, and the batch is
written again, a bounded number of rounds.

Separate from the engine and from the write passes because it wraps whichever pass the core chose, the same way for
a plain batch, a deduplicated one and a change stream's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eo.core.abilities import RowRefusals, has_role, role
from airflow_eo.core.batch import BatchContext, ExecutionResult
from airflow_eo.core.config import BadRecordPolicy, ParseConfig
from airflow_eo.core.errors import BadRecordError, UnavailableError
from airflow_eo.core.protocol import Sink
from airflow_eo.core.refused_rows import MAX_REFUSED_PER_TASK, REFUSAL_ROUNDS, ROW_LOCK_WAIT_S
from airflow_eo.spark.partition_runner import default_parallelism, write_tasks
from airflow_eo.spark.refused_rows import WriteRefused, find_refused, mark_all_refused, mark_refused

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: One write of the batch (the engine's: the pass the core chose) ``(spark, parsed, payload, batch, sink)``.
WriteOnce = Callable[["SparkSession", "DataFrame", list[str], BatchContext, Sink], ExecutionResult]


@dataclass(frozen=True)
class RefusalRounds:
    """A batch's write, again without the records the table refused.

    :param parse: the bad-record policy and the writer tasks.
    :param transformed: the rows are a transform's output (a row the table refuses is no record: the batch fails).
    :param write_once: one write of the batch.
    """

    parse: ParseConfig
    transformed: bool
    write_once: WriteOnce

    def write(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
              sink: Sink) -> ExecutionResult:
        """:meth:`written`'s result."""
        return self.written(spark, parsed, payload, batch, sink)[0]

    def written(self, spark: SparkSession, parsed: DataFrame, payload: list[str], batch: BatchContext,
                sink: Sink, originals: DataFrame | None = None, write_once: WriteOnce | None = None
                ) -> tuple[ExecutionResult, DataFrame]:
        """``write_once``; when the table refused a row that no rule could tell before (a constraint, a trigger:
        :mod:`airflow_eo.core.refused_rows`), the records it refuses are found by probes and become bad records, and
        the batch is written again (what the failed write left prepared is rolled back by the probes and the new
        write's tasks; an upsert sink's rows are written again, the same). Under ``on_bad_record="fail"`` the batch
        fails naming the first. A transform's output row cannot be traced to a record: the batch fails.
        ``originals``: the records, when ``parsed``'s good ones carry no raw fields
        (:func:`~airflow_eo.spark.refused_rows.without_raw_fields`); ``write_once``: this batch's write, in place of
        the engine's. Returns the result and ``parsed`` as written
        (the refused records bad)."""
        rounds, one_task = 0, False
        while rounds < REFUSAL_ROUNDS:
            try:
                with write_tasks(1 if one_task else None):
                    return (write_once or self.write_once)(spark, parsed, payload, batch, sink), parsed
            except WriteRefused as refused:
                if not has_role(sink, RowRefusals) or not role(sink, RowRefusals).refused_by_output(refused.writer):
                    raise  # the dead-letter or seen-id table: no record of the batch to blame
                table = role(sink, RowRefusals).output_table
                role(sink, RowRefusals).void_refused_write(batch)
                if refused.lock_wait:
                    if one_task:
                        raise UnavailableError(
                            f"a write task of table {table} waited {ROW_LOCK_WAIT_S} s for a row lock "
                            f"({refused.error}) with the batch written in one task: another transaction holds it. "
                            "Nothing was committed; the next attempt writes the batch again.") from refused
                    # Perhaps two tasks' records of one value of a unique index, the later waiting on the earlier's
                    # prepared branch: in one task they meet in one transaction (core/refused_rows.py).
                    log.warning("a write task of table %s waited %s s for a row lock (%s): the batch is written "
                                "again in one task", table, ROW_LOCK_WAIT_S, refused.error)
                    one_task = True
                    continue
                rounds += 1
                if self.transformed:
                    parsed = self._all_refused(parsed, table, refused, originals)
                    continue
                tasks = 1 if one_task else self.parse.write_partitions or default_parallelism(spark)
                found, more = find_refused(parsed, refused.writer, tasks)
                if not found and tasks > 1:
                    # Every record of each task taken: perhaps two tasks' records of one value of a unique index,
                    # which meet in one task's probes.
                    found, more = find_refused(parsed, refused.writer, 1)
                if not found:  # a refusal the probes do not meet again
                    raise BadRecordError(
                        f"table {table} refused a row of this batch ({refused.error}), but no record when written "
                        "again task by task and in one task. Nothing was committed.") from refused
                first = found[0]
                where = f"{first.topic}[{first.partition}] offset {first.offset}"
                if more and self.parse.on_bad_record is BadRecordPolicy.FAIL:
                    raise BadRecordError(
                        f"table {table} refuses more than {MAX_REFUSED_PER_TASK} records of one write task; the "
                        f"first: {where}: {first.error}. Nothing was committed. Fix the table or the producer."
                    ) from refused
                if more:  # a producer's flood must not hold the pipeline: the rest of the batch goes on
                    log.warning("table %s refuses more than %s records of one write task: the slices it still "
                                "refused after those become dead letters whole (they may hold records it would "
                                "take; replay them from the dead-letter table)", table, MAX_REFUSED_PER_TASK)
                if self.parse.on_bad_record is BadRecordPolicy.FAIL:
                    raise BadRecordError(
                        f"table {table} refused {len(found)} record(s) of this batch; the first: {where}: "
                        f"{first.error}. Nothing was committed. Fix the producer or the table, or set "
                        "on_bad_record='dead_letter' to divert them to the dead-letter table.") from refused
                log.warning("table %s refused %s record(s) (the first: %s: %s): they become dead letters and the "
                            "batch is written again without them", table, len(found), where, first.error)
                parsed = mark_refused(parsed, found, table, originals)
        raise BadRecordError(f"table {role(sink, RowRefusals).output_table} still refused rows after "
                             f"{REFUSAL_ROUNDS} rounds of finding them: nothing was committed")

    def _all_refused(self, parsed: DataFrame, table: str, refused: WriteRefused,
                     originals: DataFrame | None) -> DataFrame:
        """A row of the transform's output refused: no one record made it, so under ``dead_letter`` every record of
        the batch becomes a dead letter (the set, byte for byte, to replay once the transform or the table is
        fixed) and the pipeline goes on; under ``fail`` the batch fails."""
        if self.parse.on_bad_record is BadRecordPolicy.FAIL:
            raise BadRecordError(
                f"table {table} refused a row of the transform's output: {refused.error}. A transformed row is not "
                "one record: nothing was committed. Change the transform (filter what the table refuses) or the "
                "table, or set on_bad_record='dead_letter' to divert the batch's records to the dead-letter "
                "table.") from refused
        log.warning("table %s refused a row of the transform's output (%s): every record of the batch becomes a "
                    "dead letter", table, refused.error)
        return mark_all_refused(
            parsed, f"table {table} refused a row of the transform's output: {refused.error} (a transformed row is "
                    "not one record: every record of its batch is a dead letter)", originals)
