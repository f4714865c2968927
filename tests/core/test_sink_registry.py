"""The sink and offset-store registries (``airflow_eo.core.sink_kinds``, ``airflow_eo.core.stores``).

The recipe of ``docs/architecture.md`` ("How to add a database") as a test: a kind defined here, in one place
(a frozen spec, its capabilities, a factory), registered with one call, is built from connections, recorded by
the store, rebuilt from that record and runs the commit protocol, without a change anywhere else.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from typing import Any

import pytest

import airflow_eo.integrations  # noqa: F401  (registers the built-in kinds)
from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.batch import RunRequest
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.errors import ConfigurationError, OperationError
from airflow_eo.core.protocol import run_batch
from airflow_eo.core.rewind import PartitionChange, RewindKind, RewindPlan, RewindTarget, check_rewind
from airflow_eo.core.sink_kinds import (
    SinkAsset,
    SinkSpec,
    capabilities_of,
    register_sink,
    sink_kind,
    sink_kinds,
    spec_from_record,
)
from airflow_eo.core.stores import register_store, store_for
from airflow_eo.sinks import KafkaTransactionalSink, MySqlUpsertSink, MySqlXaSink
from tests.core.fakes.engine import FakeEngine
from tests.core.fakes.processes import Process
from tests.core.fakes.sinks import FakeXaSink, XaServer
from tests.core.fakes.source import FakeSource
from tests.core.fakes.store import FakeStore

SERVERS: dict[str, XaServer] = {}  # "the database" of the test kind, by its connection's host


@dataclass(frozen=True)
class LedgerSink(SinkSpec):
    """A new sink kind as a DAG would declare it: options only, checked when constructed."""

    table: str
    conn_id: str = "ledger_default"

    def __post_init__(self) -> None:
        if not self.table.isidentifier():
            raise ConfigurationError(f"LedgerSink: table {self.table!r} is not an identifier; name a table")

    @property
    def target(self) -> str:
        return self.table

    def asset(self, connections: Any) -> SinkAsset:
        return SinkAsset(f"ledger://{connections.connection(self.conn_id).host}", self.table)


def build_ledger(spec: LedgerSink, pipeline_id: str, connections: Any, store_conn_id: str | None) -> FakeXaSink:
    """The factory: the adapter gets its collaborators (the server behind the connection) in its constructor."""
    server = SERVERS[connections.connection(spec.conn_id).host]
    return FakeXaSink(server, Process())


class FakeConnections:
    """The registry's Connections role over a dict (the Airflow layer reads Airflow connections)."""

    def __init__(self, **connections: ConnectionInfo) -> None:
        self.connections = connections

    def connection(self, conn_id: str) -> ConnectionInfo:
        return self.connections[conn_id]

    def kafka_config(self, conn_id: str) -> dict[str, Any]:
        raise AssertionError("the test kind needs no Kafka connection")


@pytest.fixture
def ledger_kind():
    from airflow_eo.core import sink_kinds

    kind = register_sink(LedgerSink, SinkCapabilities(accumulates=True, in_doubt_branches=True,
                                                      connection_type="ledger"), build_ledger)
    yield kind
    sink_kinds._KINDS.pop(kind.name)


def test_a_kind_registered_once_is_built_from_connections_recorded_rebuilt_and_runs_the_protocol(ledger_kind):
    SERVERS["db1"] = server = XaServer()
    connections = FakeConnections(ledger_default=ConnectionInfo("ledger_default", "ledger", host="db1"))
    spec = LedgerSink(table="totals")

    assert spec.kind == "LedgerSink" and sink_kinds()["LedgerSink"] is ledger_kind
    assert spec.asset(connections).uri == "ledger://db1/totals"
    record = spec.record()
    assert (record.kind, record.accumulating, record.conn_id, record.target) == ("LedgerSink", True,
                                                                                 "ledger_default", "totals")
    assert spec_from_record(record) == spec
    assert spec_from_record(record, conn_id="ledger_other") == LedgerSink(table="totals", conn_id="ledger_other")
    assert capabilities_of(record) == ledger_kind.capabilities

    # The protocol runs with the adapter the registry built, as the operator does (hooks/sinks.build_sink).
    adapter = sink_kind(spec.kind).build(spec, "p", connections, None)
    source, store, proc = FakeSource({"t": 2}), FakeStore(), Process()
    source.produce("t", 0, 3)
    source.produce("t", 1, 2)
    summary = run_batch(RunRequest("p", "r1", ["t"], sink=record), store, source, FakeEngine(source, proc), adapter)

    assert summary.rows_out == 5 and [b.state for b in store.all_batches("p")] == [BatchState.COMMITTED]
    assert sorted(server.applied.values()) == [1] * 5 and not server.prepared
    SERVERS.clear()


def test_the_spec_is_frozen_and_checked_when_the_dag_declares_it(ledger_kind):
    with pytest.raises(ConfigurationError, match="is not an identifier"):
        LedgerSink(table="totals; drop")
    with pytest.raises(FrozenInstanceError):
        LedgerSink(table="totals").table = "other"  # type: ignore[misc]


def test_another_class_under_a_registered_kinds_name_is_refused(ledger_kind):
    @dataclass(frozen=True)
    class LedgerSink(SinkSpec):  # same name, another module's class
        conn_id: str = "x"

        def asset(self, connections: Any) -> SinkAsset:
            raise NotImplementedError

    with pytest.raises(ConfigurationError, match="registered twice"):
        register_sink(LedgerSink, SinkCapabilities(), build_ledger)
    assert sink_kind("LedgerSink") is ledger_kind


def test_an_unknown_kind_names_the_kinds_that_exist():
    record = SinkRecord(kind="CassandraSink", accumulating=False, conn_id="c", target="t", dead_letter_table=None,
                        options={})
    with pytest.raises(ConfigurationError, match=r"'CassandraSink' is not one airflow_eo can rebuild "
                                                 r"\(DeltaTableSink, IcebergTableSink, KafkaTransactionalSink, "
                                                 r"MySqlUpsertSink, MySqlXaSink"):
        spec_from_record(record)
    assert capabilities_of(record) is None and capabilities_of(None) is None


def test_the_built_in_kinds_say_what_they_can_do():
    upsert = MySqlUpsertSink(table="t", key_columns=["k"])
    xa = MySqlXaSink(table="t", key_columns=["k"], updates={"n": "add"})
    kafka = KafkaTransactionalSink(topic="out")
    assert (upsert.replay_safe, upsert.accumulating, upsert.keeps_dead_letters) == (True, False, True)
    assert (xa.replay_safe, xa.accumulating, xa.capabilities.in_doubt_branches) == (False, True, True)
    assert (kafka.accumulating, kafka.capabilities.appends, kafka.capabilities.consumer_group,
            kafka.keeps_dead_letters) == (True, True, True, False)
    for spec in (upsert, xa, kafka):
        assert spec_from_record(spec.record()) == spec


def test_a_rewind_over_an_accumulating_kind_is_refused_by_asking_its_capabilities(ledger_kind):
    """core/rewind asks the recorded kind what it can do; a new accumulating kind is refused with no change there."""
    plan = RewindPlan("p", RewindTarget(RewindKind.EARLIEST), (PartitionChange("t", 0, old=5, new=0),))
    record = LedgerSink(table="totals").record()
    with pytest.raises(OperationError, match="writes through LedgerSink, which adds to existing rows"):
        check_rewind(plan, Mode.CONTINUOUS, [], record, allow_double_count=False)
    check_rewind(plan, Mode.CONTINUOUS, [], record, allow_double_count=True)


def test_the_offset_store_is_chosen_by_its_connections_type():
    built: list[ConnectionInfo] = []
    register_store("ledger", lambda connection: built.append(connection) or "a ledger store")  # type: ignore[arg-type, func-returns-value]
    try:
        connection = ConnectionInfo("eo_store", "ledger", host="db1")
        assert store_for(connection) == "a ledger store" and built == [connection]
        with pytest.raises(ConfigurationError, match=r"'eo_store' has type 'sqlite'; the offset store runs on a "
                                                     r"connection of type ledger or mysql"):
            store_for(ConnectionInfo("eo_store", "sqlite"))
    finally:
        from airflow_eo.core import stores

        stores._STORES.pop("ledger")
