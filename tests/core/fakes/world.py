"""One pipeline (:class:`World`): a topic, a store and a sink server, and its task attempts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from airflow_eo.core.batch import BatchSummary, RunRequest
from airflow_eo.core.protocol import run_batch
from tests.core.fakes.engine import FakeEngine
from tests.core.fakes.processes import RUNNING, Process, Stepped
from tests.core.fakes.sinks import FakeKafkaSink, FakeUpsertSink, FakeXaSink, KafkaCluster, UpsertTable, XaServer
from tests.core.fakes.source import FakeSource, Record, RecordId
from tests.core.fakes.store import STORE_WRITES, FakeStore

SINK_KINDS = ("xa", "upsert", "kafka")


class World:
    """One pipeline over one fake topic, one store and one sink server; :meth:`attempt` runs one task attempt
    (its own process, engine and sink adapter over the shared store, topic and server)."""

    def __init__(self, kind: str = "xa", *, partitions: int = 2, topic: str = "t", pipeline_id: str = "p",
                 keys_per_partition: int | None = None, fenced_upsert: bool = False) -> None:
        self.kind, self.topic, self.pipeline_id = kind, topic, pipeline_id
        self.store = FakeStore()
        self.source = FakeSource({topic: partitions})
        self.server: Any = (UpsertTable(keys_per_partition) if kind == "upsert" else
                            {"xa": XaServer, "kafka": KafkaCluster}[kind]())
        self.fenced_upsert = fenced_upsert
        self.check_error: Exception | None = None

    def sink(self, proc: Process) -> Any:
        if self.kind == "upsert":
            return FakeUpsertSink(self.server, proc, self.check_error, self.store if self.fenced_upsert else None)
        return {"xa": FakeXaSink, "kafka": FakeKafkaSink}[self.kind](self.server, proc, self.check_error)

    def produce(self, partition: int, count: int = 1, **kwargs: Any) -> list[Record]:
        return self.source.produce(self.topic, partition, count, **kwargs)

    def attempt(self, run_id: str, proc: Process | None = None, **options: Any) -> BatchSummary:
        """One task attempt of ``run_id`` (``options``: the other ``RunRequest`` fields)."""
        proc = Process() if proc is None else proc
        proc.engine = FakeEngine(self.source, proc)
        proc.sink = self.sink(proc)
        request = RunRequest(self.pipeline_id, run_id, [self.topic], **options)
        RUNNING.append(proc)
        try:
            return run_batch(request, Stepped(self.store, proc, "store", STORE_WRITES),
                             Stepped(self.source, proc, "source"), proc.engine, proc.sink)
        finally:
            RUNNING.pop()

    # ------------------------------------------------------------------ the effect

    def visible(self) -> Counter[RecordId]:
        """How many times each record's effect is visible in the sink's output."""
        if self.kind == "xa":
            return Counter(self.server.applied)
        if self.kind == "kafka":
            return Counter(rec.id for rec in self.server.output)
        rows = self.server.rows
        return Counter(rec.id for rec in self.source.records() if rows.get(self.server.key_of(rec)) == rec.value)

    def exactly_once_problems(self, records: Iterable[Record] | None = None) -> list[str]:
        """What differs from "every record's effect visible exactly once" (default: every produced record)."""
        records = self.source.records() if records is None else list(records)
        problems = []
        if self.kind == "upsert":
            expected = self.server.expected(records)
            if self.server.rows != expected:
                wrong = sorted(k for k in expected.keys() | self.server.rows.keys()
                               if self.server.rows.get(k) != expected.get(k))
                problems.append(f"table differs from the expected one at keys {wrong}")
        else:
            visible, expected = self.visible(), Counter(rec.id for rec in records)
            if visible != expected:
                problems.append(f"applied != once: missing {sorted(expected - visible)}, "
                                f"extra {sorted(visible - expected)}")
        if self.kind == "xa" and self.server.prepared:
            problems.append(f"prepared branches left: {sorted(self.server.prepared)}")
        if self.kind == "kafka" and self.server.open is not None:
            problems.append("a Kafka transaction is left open")
        return problems
