"""A sink kind's abilities are declared once, at its registration (``core/abilities.py``): every built-in kind's
adapter, as its factory builds it, implements the role of every ability its kind declares and no other, and asks
nothing of its own (``capabilities`` is its kind's). The engine, operations, CLI and operator ask through
``role`` / ``has_role``, never by probing an adapter."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import airflow_eo
import airflow_eo.integrations
from airflow_eo.core.abilities import (
    ROLES,
    DeadLetterTable,
    SeenIds,
    SinkCapabilities,
    has_role,
    role,
    roles_implemented,
)
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.sink_kinds import SinkSpec, sink_kinds
from airflow_eo.delta.specs import DeltaTableSink
from airflow_eo.iceberg.specs import IcebergTableSink
from airflow_eo.kafka.specs import KafkaTransactionalSink
from airflow_eo.mysql.specs import MySqlUpsertSink, MySqlXaSink
from airflow_eo.postgres.specs import PostgresTwoPhaseSink, PostgresUpsertSink


class Connections:
    """Connections of every type a built-in kind's factory reads (nothing is reached: factories connect nowhere)."""

    def connection(self, conn_id: str) -> ConnectionInfo:
        conn_type = conn_id.split("_")[0]
        return ConnectionInfo(conn_id, conn_type, host="127.0.0.1", port=1, login="eo", password="eo",
                              schema="airflow_eo")

    def kafka_config(self, conn_id: str) -> dict[str, Any]:
        return {"bootstrap.servers": "127.0.0.1:1"}


def examples(tmp: Path) -> dict[str, SinkSpec]:
    """One spec of every built-in kind; a new kind adds its own (the test below fails on a kind without one)."""
    return {spec.kind: spec for spec in (
        MySqlUpsertSink(table="t", key_columns=["k"]),
        MySqlXaSink(table="t", key_columns=["k"]),
        PostgresUpsertSink(table="t", key_columns=["k"]),
        PostgresTwoPhaseSink(table="t", key_columns=["k"]),
        KafkaTransactionalSink(topic="out"),
        DeltaTableSink(path=str(tmp / "delta")),
        IcebergTableSink(table="lake.db.t", warehouse=str(tmp / "iceberg")),
    )}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Any]:
    specs = examples(tmp_path_factory.mktemp("tables"))
    missing = sorted(set(sink_kinds()) - set(specs))
    assert not missing, f"no example spec for the registered kind(s) {missing}: add one to examples()"
    return {name: kind.build(specs[name], "p", Connections(), None) for name, kind in sink_kinds().items()}


def test_every_kind_implements_the_role_of_each_ability_it_declares_and_no_other(adapters):
    for name, adapter in adapters.items():
        declared = sink_kinds()[name].capabilities.abilities()
        assert roles_implemented(adapter) == declared, (
            f"{name}: declares {sorted(declared)}, its adapter {type(adapter).__name__} implements the roles of "
            f"{sorted(roles_implemented(adapter))}")
        assert adapter.capabilities is sink_kinds()[name].capabilities  # the kind's, not the adapter's own


#: the descriptor's methods an ability's tables need, which a database without the ability need not spell
DESCRIPTOR_METHODS = {"seen_ids": ("seen_id_ddl", "purge_seen_ids"), "applies_changes": ("change_position_ddl",)}


def test_a_sql_database_spells_the_tables_of_every_ability_its_kinds_declare(adapters):
    """The descriptor's abstract methods are checked by mypy and Python; these hang on the abilities."""
    from airflow_eo.sqlsink.database import SqlDatabase

    checked = set()
    for name, adapter in adapters.items():
        database = getattr(type(adapter), "database", None)
        if not isinstance(database, SqlDatabase):
            continue
        for ability, methods in DESCRIPTOR_METHODS.items():
            if ability in sink_kinds()[name].capabilities.abilities():
                for method in methods:
                    assert getattr(type(database), method) is not getattr(SqlDatabase, method), (
                        f"{name} declares {ability}: {type(database).__name__} must define {method}")
                    checked.add((type(database).__name__, method))
    assert {db for db, _ in checked} == {"MySqlDatabase", "PostgresDatabase"}


def test_the_abilities_of_the_built_in_kinds(adapters):
    abilities = {name: sorted(kind.capabilities.abilities()) for name, kind in sink_kinds().items()}
    sql = ["dead_letters", "refused_rows", "seen_ids", "value_checks"]
    upsert = sorted([*sql, "applies_changes"])
    assert abilities == {
        "MySqlUpsertSink": upsert, "PostgresUpsertSink": upsert,
        "MySqlXaSink": sorted([*sql, "in_doubt_branches"]), "PostgresTwoPhaseSink": sorted([*sql, "in_doubt_branches"]),
        "KafkaTransactionalSink": ["consumer_group"],
        "DeltaTableSink": ["merges_changes", "table_commits"], "IcebergTableSink": ["merges_changes", "table_commits"],
    }
    owners = {name for name, kind in sink_kinds().items() if kind.capabilities.owns_commit_point}
    assert owners == {"KafkaTransactionalSink", "DeltaTableSink", "IcebergTableSink"}


def test_role_refuses_an_ability_the_kind_does_not_declare_with_what_asked(adapters):
    kafka = adapters["KafkaTransactionalSink"]
    assert not has_role(kafka, SeenIds)
    with pytest.raises(ConfigurationError, match=r"sink kind 'KafkaTransactionalSink' does not have the 'seen_ids' "
                                                 r"capability \(dedup_key\)"):
        role(kafka, SeenIds, "dedup_key")
    assert role(adapters["MySqlXaSink"], DeadLetterTable) is adapters["MySqlXaSink"]


def test_a_kind_declaring_an_ability_whose_role_its_adapter_lacks_is_named():
    class Adapter:
        name = "Half"
        capabilities = SinkCapabilities(seen_ids=True)

    with pytest.raises(ConfigurationError, match=r"sink kind 'Half' declares the 'seen_ids' capability, but its "
                                                 r"adapter .*Adapter does not implement SeenIds \(it has no "
                                                 r"key_columns, purge_seen_ids, seen_id_lookup, seen_id_writer\)"):
        has_role(Adapter(), SeenIds)


def test_every_role_names_a_capability():
    names = set(SinkCapabilities.__dataclass_fields__)
    assert set(ROLES.values()) <= names


#: where the layers above the rooms ask a sink: never by probing its attributes
ASKERS = ("spark", "ops", "cli", "operators", "plugins", "sensors", "triggers", "hooks", "core/protocol.py")
#: probes of what is not a sink (file, the probed name)
NOT_A_SINK = {("spark/record_counts.py", "_jo"), ("operators/alerts.py", "run_id"),
              ("operators/micro_batch.py", "map_index"), ("operators/micro_batch.py", "interval")}


def test_no_layer_probes_a_sink_for_an_ability():
    """``getattr(sink, ...)`` / ``hasattr`` of a role's member outside the rooms would be a second way to ask."""
    package = Path(airflow_eo.__file__).parent
    members = {m for wanted in ROLES for m in vars(wanted) if not m.startswith("_")} | {
        "table", "owns_commit_point", "writes_visible_before_commit", "commits_only_after_write_job"}
    found = set()
    for asker in ASKERS:
        paths = [package / asker] if asker.endswith(".py") else sorted((package / asker).rglob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and \
                        len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                    probe = (path.relative_to(package).as_posix(), node.args[1].value)
                    if probe[1] in members and probe not in NOT_A_SINK:
                        found.add(probe)
    assert not found
