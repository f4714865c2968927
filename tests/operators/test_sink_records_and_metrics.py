"""What a take records of the sink (``SinkSpec.record``), its round trip for ``airflow eo``, the batch metrics,
and the ``airflow eo`` command group (no stack needed)."""

from __future__ import annotations

import argparse
import importlib
from datetime import timedelta

import pytest

from airflow_eo import get_provider_info
from airflow_eo.core.batch import BatchSummary
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.operators.metrics import airflow_stats, emit_batch_metrics
from airflow_eo.sinks import KafkaTransactionalSink, MySqlUpsertSink, MySqlXaSink, spec_from_record


@pytest.mark.parametrize("spec, accumulating, dead_letters", [
    (MySqlUpsertSink(table="db.events", key_columns=["id"], dead_letter_table="bad"), False, "bad"),
    (MySqlXaSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"}), True, "eo_dead_letter"),
    (MySqlXaSink(table="latest", key_columns=["k"], updates={"v": "replace"}), False, "eo_dead_letter"),
    (KafkaTransactionalSink(topic="out", conn_id="kafka_out"), True, None),
])
def test_a_sink_spec_is_recorded_and_rebuilt_from_its_record(spec, accumulating, dead_letters):
    record = spec.record()
    assert (record.kind, record.accumulating, record.dead_letter_table) == (type(spec).__name__, accumulating,
                                                                             dead_letters)
    assert record.conn_id == spec.conn_id and record.target in ("db.events", "app_pv", "latest", "out")
    stored = SinkRecord.from_json(record.to_json())  # through the store's JSON column
    assert stored == record and spec_from_record(stored) == spec
    assert spec_from_record(stored, "other_conn").conn_id == "other_conn"


def test_an_unknown_sink_kind_is_not_rebuilt():
    with pytest.raises(ConfigurationError, match="not one airflow_eo can rebuild"):
        spec_from_record(SinkRecord("PostgresSink", accumulating=False))


class FakeStats:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def incr(self, stat, count=1, rate=1, *, tags=None):
        self.calls.append(("incr", stat, count, tags))

    def gauge(self, stat, value, rate=1, delta=False, *, tags=None):
        self.calls.append(("gauge", stat, value, tags))

    def timing(self, stat, dt, *, tags=None):
        self.calls.append(("timing", stat, dt, tags))


def test_a_batch_emits_its_counts_lag_and_phases_tagged_by_pipeline():
    summary = BatchSummary("p.x", 3, "run", 2, (OffsetRange("t", 0, 0, 10),), records_in=10, rows_out=4,
                           dead_letters=1, duplicates=3, seconds={"plan": 0.5, "read_transform": 2.0, "commit": 0.25})
    stats = FakeStats()
    emit_batch_metrics(summary, {"t[0]": 7, "t[1]": 5}, stats)
    tags = {"pipeline_id": "p.x"}
    assert stats.calls == [
        ("incr", "airflow_eo.batch.committed", 1, tags), ("incr", "airflow_eo.batch.records_in", 10, tags),
        ("incr", "airflow_eo.batch.rows_out", 4, tags), ("incr", "airflow_eo.batch.dead_letters", 1, tags),
        ("incr", "airflow_eo.batch.duplicates", 3, tags), ("gauge", "airflow_eo.lag", 12, tags),
        ("timing", "airflow_eo.batch.seconds.plan", timedelta(seconds=0.5), tags),
        ("timing", "airflow_eo.batch.seconds.read_transform", timedelta(seconds=2), tags),
        ("timing", "airflow_eo.batch.seconds.commit", timedelta(seconds=0.25), tags)]
    cleared = FakeStats()
    emit_batch_metrics(BatchSummary("p.x", 3, "run", 2, (), already_committed=True), None, cleared)
    assert cleared.calls == []  # a cleared run that had committed did nothing


def test_airflow_exposes_stats_to_providers():
    stats = airflow_stats()
    assert stats is not None and all(callable(getattr(stats, m)) for m in ("incr", "gauge", "timing"))


def test_the_provider_registers_the_eo_command_group():
    from airflow.cli.cli_parser import _add_command

    [path] = get_provider_info()["cli"]
    module, _, name = path.rpartition(".")
    [group] = getattr(importlib.import_module(module), name)()
    assert group.name == "eo"
    assert sorted(c.name for c in group.subcommands) == ["dead-letters", "history", "pipelines", "prune", "recover",
                                                         "rename", "retire", "rewind", "seed", "status", "verify"]
    parser = argparse.ArgumentParser()
    _add_command(parser.add_subparsers(dest="subcommand"), group)
    args = parser.parse_args(["eo", "rewind", "p", "--to-earliest", "--i-understand-reprocessing-double-counts"])
    assert args.to_earliest and args.allow_double_count and not args.apply and args.output == "table"
    # No connection given: the command leaves the choice to [eo] in airflow.cfg, else the operator's defaults.
    assert args.offset_store_conn_id is None and args.kafka_conn_id is None
    args = parser.parse_args(["eo", "prune", "--older-than", "90d"])
    assert (args.pipeline_id, args.older_than, args.apply, args.reason) == (None, "90d", False, None)
    args = parser.parse_args(["eo", "retire", "p", "--dead-letters", "--idle-for", "1m"])
    assert (args.pipeline_id, args.dead_letters, args.idle_for, args.undo, args.apply) == (
        "p", True, "1m", False, False)
    args = parser.parse_args(["eo", "rename", "old", "new", "--apply", "--reason", "moved"])
    assert (args.pipeline_id, args.new_pipeline_id, args.apply, args.reason) == ("old", "new", True, "moved")


def test_the_commands_default_connections_come_from_the_eo_config_section(monkeypatch):
    from airflow_eo.hooks.operations import AirflowConnections, pipeline_operations

    monkeypatch.setattr(AirflowConnections, "store", lambda self: None)  # only the choice of connections is tested
    ops = pipeline_operations(actor="test")
    assert (ops.connections.offset_store_conn_id, ops.connections.kafka_conn_id) == ("eo_offset_store", "kafka_default")
    monkeypatch.setenv("AIRFLOW__EO__OFFSET_STORE_CONN_ID", "ops_store")
    monkeypatch.setenv("AIRFLOW__EO__KAFKA_CONN_ID", "ops_kafka")
    ops = pipeline_operations(actor="test")
    assert (ops.connections.offset_store_conn_id, ops.connections.kafka_conn_id) == ("ops_store", "ops_kafka")
    ops = pipeline_operations("given_store", "given_kafka", actor="test")
    assert (ops.connections.offset_store_conn_id, ops.connections.kafka_conn_id) == ("given_store", "given_kafka")


def eo_args(*argv: str) -> argparse.Namespace:
    from airflow.cli.cli_parser import _add_command

    from airflow_eo.cli.definition import get_eo_cli_commands

    parser = argparse.ArgumentParser()
    _add_command(parser.add_subparsers(dest="subcommand"), get_eo_cli_commands()[0])
    return parser.parse_args(["eo", *argv])


@pytest.mark.parametrize("argv, words", [
    (["rewind", "p"], "give exactly one of --to-earliest, --to-latest"),
    (["rewind", "p", "--to-latest", "--to-offsets", "{}"], "(got --to-latest, --to-offsets)"),
    (["rewind", "p", "--to-offsets", "{nope"], "--to-offsets is not JSON"),
    (["rewind", "p", "--to-offsets", '{"t": {"0": -3}}'], "non-negative integers"),
    (["rewind", "p", "--to-datetime", "yesterday"], "not an ISO 8601 time"),
    (["rewind", "p", "--to-latest", "--apply"], "--apply needs --reason"),
    (["rewind", "p", "--to-latest", "--apply", "--dry-run", "--reason", "r"], "contradict each other"),
])
def test_bad_rewind_arguments_fail_before_anything_is_connected(argv, words, monkeypatch):
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "")  # the command sets it: restored after the test
    args = eo_args(*argv)
    with pytest.raises(SystemExit) as failed:
        args.func(args)
    assert str(failed.value).startswith("airflow eo rewind: ") and words in str(failed.value)


@pytest.mark.parametrize("argv, words", [
    (["verify"], "name a pipeline or give --all (every pipeline's in-doubt work), not neither"),
    (["verify", "p", "--all"], "not both"),
    (["verify", "p", "--older-than", "5m"], "--older-than goes with --all only"),
    (["verify", "--all", "--older-than", "ten minutes"], "give seconds (600) or a number with a unit"),
    (["recover"], "name a pipeline or give --orphans"),
    (["recover", "p", "--unknown", "rollback"], "--unknown go(es) with --orphans only"),
    (["recover", "--orphans", "--older-than", "-1"], "is not a duration"),
    (["recover", "--orphans", "--apply"], "--apply needs --reason"),
])
def test_bad_in_doubt_arguments_fail_before_anything_is_connected(argv, words, monkeypatch):
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "")  # the command sets it: restored after the test
    args = eo_args(*argv)
    with pytest.raises(SystemExit) as failed:
        args.func(args)
    assert str(failed.value).startswith(f"airflow eo {argv[0]}: ") and words in str(failed.value), failed.value


def test_the_in_doubt_gauge_is_emitted_per_database():
    from airflow_eo.hooks.stats import emit_in_doubt_gauges

    class Stats:
        def __init__(self):
            self.gauges = []

        def gauge(self, name, value, tags):
            self.gauges.append((name, value, tags))

    stats = Stats()
    emit_in_doubt_gauges({"MySQL h:1": 900.0, "PostgreSQL h:2/db": 0.0}, stats)
    assert stats.gauges == [("airflow_eo.in_doubt.oldest_age_seconds", 900.0, {"database": "MySQL h:1"}),
                            ("airflow_eo.in_doubt.oldest_age_seconds", 0.0, {"database": "PostgreSQL h:2/db"})]
