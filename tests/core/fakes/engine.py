"""The engine: :class:`FakeEngine` reads exactly a batch's ranges and writes them through the sink."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from airflow_eo.core.batch import BatchContext, ExecutionResult, WritePlan, WriteResult
from tests.core.fakes.processes import Process
from tests.core.fakes.source import FakeSource, Record


class FakeEngine:
    """``Engine`` (and ``PartitionRunner``): reads exactly the batch's ranges, hands the records to the sink.

    The output "DataFrame" is the list of records read (an identity transform); ``run_partitions`` splits it
    by the writer's key (``writer.key_of``, default the event id) into ``write_partitions`` partitions, like
    the repartition by ``key_columns`` before a Spark write.
    """

    def __init__(self, source: FakeSource, proc: Process, write_partitions: int = 2) -> None:
        self.source, self.proc, self.write_partitions = source, proc, write_partitions
        self.calls: list[BatchContext] = []

    def check(self) -> None:
        return None

    def execute(self, batch: BatchContext, sink: Any) -> ExecutionResult:
        self.calls.append(batch)
        self.proc.step("engine.read")
        out = [rec for r in batch.ranges if r.size for rec in self.source.read(r)]
        written = sink.write(WritePlan(out, self), batch)
        self.proc.step("engine.written")
        return ExecutionResult(records_in=len(out), rows_out=written.rows, xids=list(written.xids))

    def run_partitions(self, plan: WritePlan, writer: Callable[..., tuple[str | None, int]],
                       columns: Any = None) -> WriteResult:
        out: list[Record] = plan.output
        result = WriteResult()
        key_of = getattr(writer, "key_of", lambda rec: rec.key)
        for partition in range(self.write_partitions):  # the rows of one key in one partition, in offset order
            rows = [rec for rec in out if zlib.crc32(key_of(rec).encode()) % self.write_partitions == partition]
            xid, written = writer([rows], partition, 0, 0)
            if xid:
                result.xids.append(xid)
            result.rows += written
        return result
