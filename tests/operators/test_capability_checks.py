"""A capability a sink kind declares is checked against its adapter by an explicit error, never by an ``assert``
(``python -O`` removes those): ``airflow eo`` and the DAG tab name the kind and the role its adapter lacks."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import airflow_eo
from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import ConfigurationError, OperationError
from airflow_eo.core.pipeline_status import PipelineInfo
from airflow_eo.core.rewind import RewindKind, RewindTarget
from airflow_eo.core.sink_kinds import KindAdapter, SinkAsset, SinkSpec, register_sink
from airflow_eo.kafka.sink import KafkaTransactionalAdapter
from airflow_eo.ops.service import PipelineOperations

P = "p"


@dataclass(frozen=True)
class HalfSink(SinkSpec):
    """A kind that claims every operations capability; its factory builds an adapter with none of their roles."""

    conn_id: str = "half_default"

    def asset(self, connections: Any) -> SinkAsset:
        return SinkAsset("half://", "t")


class HalfAdapter(KindAdapter):
    name = "HalfSink"


@pytest.fixture
def half_kind():
    from airflow_eo.core import sink_kinds

    kind = register_sink(HalfSink, SinkCapabilities(in_doubt_branches=True, consumer_group=True, dead_letters=True,
                                                    connection_type="half"),
                         lambda spec, pipeline_id, connections, store: HalfAdapter())
    yield kind
    sink_kinds._KINDS.pop(kind.name)


class Store:
    def __init__(self, info: PipelineInfo) -> None:
        self.info = info

    def pipeline(self, pipeline_id: str) -> PipelineInfo:
        return self.info


class Connections:
    def __init__(self, info: PipelineInfo) -> None:
        self.info = info

    def store(self) -> Store:
        return Store(self.info)

    def offset_source(self) -> Any:
        raise AssertionError("not used")

    def sink(self, pipeline_id: str, record: SinkRecord) -> Any:
        return HalfAdapter()


def operations() -> tuple[PipelineOperations, PipelineInfo]:
    info = PipelineInfo(P, 1, "dag.task", Mode.CONTINUOUS, None, HalfSink().record())
    return PipelineOperations(Connections(info), "tester"), info  # type: ignore[arg-type]


def test_a_kind_keeping_dead_letters_whose_adapter_cannot_read_them_is_named(half_kind):
    ops, _ = operations()
    with pytest.raises(ConfigurationError, match=r"sink kind 'HalfSink' declares the 'dead_letters' capability, "
                                                 r"but its adapter .*HalfAdapter does not implement DeadLetterTable "
                                                 r"\(it has no dead_letter_writer, dead_letters\)"):
        ops.dead_letters(P)


def test_a_kind_keeping_a_consumer_group_whose_adapter_cannot_read_it_is_named(half_kind):
    ops, info = operations()
    with pytest.raises(ConfigurationError, match=r"'consumer_group' capability.* does not implement "
                                                 r"ConsumerGroupSink \(it has no committed_batches, "
                                                 r"move_group_offsets, open_transactions\)"):
        ops.context.kafka_group(P, info)


def test_a_kind_preparing_branches_whose_adapter_cannot_list_them_is_named(half_kind):
    ops, info = operations()
    with pytest.raises(ConfigurationError, match=r"'in_doubt_branches' capability.* does not implement "
                                                 r"InDoubtSink \(it has no in_doubt\)"):
        ops.context.in_doubt(info, [])


def test_a_rewind_to_a_datetime_without_one_is_refused_before_kafka_is_asked(half_kind, monkeypatch):
    ops, _ = operations()
    monkeypatch.setattr(ops.store, "committed_offsets", lambda pipeline_id: {("t", 0): 5}, raising=False)
    monkeypatch.setattr(ops.store, "batch_history", lambda pipeline_id, limit: [], raising=False)
    monkeypatch.setattr(ops.context, "require_broker", lambda topics: {})
    with pytest.raises(OperationError, match="a rewind to a datetime needs the datetime"):
        ops.rewind(P, RewindTarget(RewindKind.DATETIME))


def test_the_kafka_sink_refuses_dead_letters_instead_of_dropping_them():
    adapter = object.__new__(KafkaTransactionalAdapter)  # no client: write_dead_letters asks no broker
    adapter.name = "KafkaTransactionalSink"
    assert adapter.write_dead_letters(None, iter(())) == []  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="KafkaTransactionalSink keeps no dead letters"):
        adapter.write_dead_letters(None, iter([object()]))  # type: ignore[arg-type]


#: ``assert isinstance`` left in the package: type narrowing of what cannot fail (file, the isinstance's type)
NARROWING_ONLY = {("spark/partition_runner.py", "BarrierTaskContext")}  # agreed() runs only in a barrier stage's task


def test_no_assert_checks_a_type_at_run_time():
    """``python -O`` removes asserts: a check that can fail raises an error of its own."""
    package = Path(airflow_eo.__file__).parent
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Call) and \
                    getattr(node.test.func, "id", None) == "isinstance":
                found.add((path.relative_to(package).as_posix(), ast.unparse(node.test.args[1])))
    assert found == NARROWING_ONLY
