"""The Spark engine carries out the write strategy the core chooses (``core/write_strategy.py``), asking Spark and the
sink for the facts only when the choice needs them. No Spark: the engine's passes are stood in for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.batch import BatchContext
from airflow_eo.core.config import BadRecordPolicy, ParseConfig, ValueFormat
from airflow_eo.spark import engine as engine_module
from airflow_eo.spark.engine import SparkBatchEngine

BATCH = BatchContext("p", 1, "run", 1, ())


class FakeSpark:
    def addTag(self, tag: str) -> None:
        pass

    def removeTag(self, tag: str) -> None:
        pass


class FakeParsed:
    def select(self, *columns: Any) -> tuple[str, ...]:
        return ("output of", *columns)


class FakeSink:
    name = "fake"

    def __init__(self, visible: bool, hold: bool, commits_after_job: bool = False) -> None:
        self.hold, self.asked = hold, []
        self.capabilities = SinkCapabilities(writes_visible_before_commit=visible,
                                             commits_only_after_write_job=commits_after_job)

    def can_hold_writes(self, out: Any) -> bool:
        self.asked.append(out)
        return self.hold


def run(monkeypatch, *, visible: bool, policy: BadRecordPolicy = BadRecordPolicy.FAIL, transform: str | None = None,
        barrier: bool = True, hold: bool = True, commits_after_job: bool = False) -> tuple[str, list[str], FakeSink]:
    engine = SparkBatchEngine(session_factory=FakeSpark, kafka_config={},
                              parse=ParseConfig(ValueFormat.STRING, on_bad_record=policy), transform=transform)
    calls: list[str] = []
    monkeypatch.setattr(engine_module, "named_columns", lambda names: list(names))
    monkeypatch.setattr(engine, "read", lambda spark, batch: "raw")
    monkeypatch.setattr(engine, "parse_records", lambda spark, raw: (FakeParsed(), ["value"]))
    monkeypatch.setattr(engine, "_barrier_possible", lambda spark: calls.append("barrier") or barrier)
    passes = {
        "write_then_validate": lambda parsed, payload, batch, sink, vote: "vote" if vote else "one pass",
        "transform_then_validate": lambda spark, parsed, payload, batch, sink: "one pass, transformed",
        "validate_then_write": lambda spark, parsed, payload, batch, sink: "two passes",
        "write_failing_on_bad_records": lambda parsed, payload, batch, sink: "one pass, failing on a bad record",
    }
    monkeypatch.setattr(engine, "passes", SimpleNamespace(**passes))  # stands in for spark/write_passes.py
    sink = FakeSink(visible, hold, commits_after_job)
    done = engine.execute(BATCH, sink)  # type: ignore[arg-type]
    return done, calls, sink  # type: ignore[return-value]


@pytest.mark.parametrize(("visible", "policy"), [(False, BadRecordPolicy.FAIL), (True, BadRecordPolicy.DEAD_LETTER)])
def test_one_pass_asks_neither_spark_nor_the_sink(monkeypatch, visible, policy):
    done, calls, sink = run(monkeypatch, visible=visible, policy=policy)
    assert (done, calls, sink.asked) == ("one pass", [], [])


def test_the_vote_asks_spark_then_the_sink_about_the_parsed_payload(monkeypatch):
    done, calls, sink = run(monkeypatch, visible=True)
    assert (done, calls, sink.asked) == ("vote", ["barrier"], [("output of", "value")])


def test_without_a_barrier_stage_two_passes_and_the_sink_is_not_asked(monkeypatch):
    done, calls, sink = run(monkeypatch, visible=True, barrier=False)
    assert (done, calls, sink.asked) == ("two passes", ["barrier"], [])


def test_a_table_sink_committing_after_its_write_job_gets_one_pass_failing_on_a_bad_record(monkeypatch):
    done, calls, sink = run(monkeypatch, visible=True, commits_after_job=True)
    assert (done, calls, sink.asked) == ("one pass, failing on a bad record", [], [])
    done, calls, sink = run(monkeypatch, visible=True, commits_after_job=True, transform="SELECT * FROM kafka_batch")
    assert (done, calls, sink.asked) == ("two passes", [], [])


def test_a_sink_that_cannot_hold_its_writes_gets_two_passes(monkeypatch):
    done, calls, sink = run(monkeypatch, visible=True, hold=False)
    assert (done, calls, sink.asked) == ("two passes", ["barrier"], [("output of", "value")])


@pytest.mark.parametrize(("visible", "policy", "expected"), [
    (False, BadRecordPolicy.FAIL, "one pass, transformed"),
    (True, BadRecordPolicy.DEAD_LETTER, "one pass, transformed"),
    (True, BadRecordPolicy.FAIL, "two passes"),
])
def test_a_transform_never_votes(monkeypatch, visible, policy, expected):
    done, calls, sink = run(monkeypatch, visible=visible, policy=policy, transform="SELECT * FROM kafka_batch")
    assert (done, calls, sink.asked) == (expected, [], [])

