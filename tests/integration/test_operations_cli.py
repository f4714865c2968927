"""``airflow eo`` against the real stack, run as the venv's ``airflow`` in a subprocess.

An XA batch dies right after its commit point (its branches stay prepared): ``status`` shows them in doubt
with "commit", ``recover`` is a dry run until ``--apply --reason``, a recovery that dies midway is already
audited, ``recover --apply`` commits them (the sink then equals the ground truth), and a rewind of that
accumulating sink is refused unless overridden (the audit row records the override). An upsert pipeline is
rewound: the dry run changes nothing, ``--apply`` is audited (``history`` shows it), and the next run
reprocesses exactly the rewound range. A rewind the store refuses under its lock leaves a Kafka sink's consumer
group where it was (in process, no Spark). Unknown pipelines and bad arguments fail clearly. Three Spark batches in
all, in this process.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_eo.cli.commands import IN_DOUBT_TITLE
from airflow_eo.core.batch import BatchSummary, Owner, RunRequest
from airflow_eo.core.errors import OperationError
from airflow_eo.core.protocol import run_batch
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.rewind import RewindKind, RewindTarget
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.mysql.database import DATABASE as MYSQL
from airflow_eo.ops.service import PipelineOperations
from airflow_eo.sinks import KafkaTransactionalSink, MySqlUpsertSink, MySqlXaSink
from airflow_eo.sqlstore.store import SqlOffsetStore
from examples import page_views
from examples.page_views import produce_page_views
from examples.topics import read_topic
from tests.support.cli import eo, eo_json
from tests.support.in_doubt import DiesBeforeXaCommit, KilledAfterCommitPoint
from tests.support.kafka import create_topic
from tests.support.kafka_group import kafka_adapter
from tests.support.operator_harness import adapters, counts_table, events_table, operator, rows, run
from tests.support.page_views import our_prepared_branches

DOUBLE_COUNT_FLAG = "--i-understand-reprocessing-double-counts"
BAD_RECORD = b"{not json"


def store_state(mysql_kwargs: dict[str, Any], pipeline: str) -> tuple:
    """What a command that must change nothing must leave as it was."""
    return (rows(mysql_kwargs, "SELECT topic, kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s "
                 "ORDER BY 1, 2", (pipeline,)),
            rows(mysql_kwargs, "SELECT epoch FROM eo_pipeline WHERE pipeline_id = %s", (pipeline,)),
            rows(mysql_kwargs, "SELECT batch_id, state FROM eo_batch WHERE pipeline_id = %s ORDER BY 1", (pipeline,)),
            rows(mysql_kwargs, "SELECT COUNT(*) FROM eo_audit WHERE pipeline_id = %s", (pipeline,)))


class KilledMidRecovery(Exception):
    """The recovering process dies after taking the epoch, before the sink resolved anything."""


class SinkDiesInRecovery:
    """The operations' connections, with a sink whose recovery dies before it starts."""

    def __init__(self, connections: Any) -> None:
        self._connections = connections

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connections, name)

    def sink(self, pipeline_id: str, record: Any) -> Any:
        real = self._connections.sink(pipeline_id, record)

        class Dies:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def recover(self, *args: Any, **kwargs: Any) -> Any:
                raise KilledMidRecovery()

        return Dies()


def test_an_in_doubt_xa_batch_is_shown_then_recovered_and_its_accumulating_sink_not_rewound(
        bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 2)
    events = produce_page_views(bootstrap, 200, topic=topic_name)
    table = counts_table(mysql_kwargs)
    spec = MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"})
    pipeline = f"ops_xa_{topic_name}"
    roles = adapters(spec, pipeline, transform=page_views.count_per_app)
    roles["sink"] = DiesBeforeXaCommit(roles["sink"])
    request = RunRequest(pipeline, "run-1", [topic_name], owner=Owner("ops_test", "micro_batch"),
                         sink=spec.record())
    with pytest.raises(KilledAfterCommitPoint):
        run_batch(request, **roles)
    prepared = our_prepared_branches(mysql_kwargs, pipeline)
    assert prepared and rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}") == [(0,)]  # in doubt, invisible

    status = eo_json("status", pipeline)
    assert status["sink"]["kind"] == "MySqlXaSink" and status["sink"]["accumulating"] is True
    assert status["owner"] == "ops_test.micro_batch" and status["mode"] == "continuous"
    assert sorted(b["xid"] for b in status["in_doubt"]) == sorted(prepared)
    assert {b["action"] for b in status["in_doubt"]} == {"commit"} and status["unfinished"] == []
    assert all("passed its commit point" in b["reason"] and b["age_seconds"] is not None for b in status["in_doubt"])
    assert len(status["partitions"]) == 2 and status["lag"] == 0
    assert all(p["committed"] == p["last_stable"] and p["log_start"] == 0 for p in status["partitions"])
    human = eo("status", pipeline)
    assert human.returncode == 0 and IN_DOUBT_TITLE in human.stdout and prepared[0] in human.stdout
    assert f"airflow eo recover {pipeline}" in human.stdout

    unchanged = store_state(mysql_kwargs, pipeline)
    for dry_args in ((), ("--dry-run",), ("--reason", "no --apply: still a dry run")):
        dry = eo_json("recover", pipeline, *dry_args)
        assert dry["dry_run"] and {b["action"] for b in dry["branches"]} == {"commit"}
        assert our_prepared_branches(mysql_kwargs, pipeline) == prepared  # a dry run changes nothing
        assert store_state(mysql_kwargs, pipeline) == unchanged
    for bad, words in ((("--apply",), "--apply needs --reason"), (("--apply", "--reason", " "), "--apply needs "
                       "--reason"), (("--apply", "--dry-run", "--reason", "x"), "contradict")):
        refused = eo("recover", pipeline, *bad)
        assert refused.returncode != 0 and words in refused.stderr
    assert store_state(mysql_kwargs, pipeline) == unchanged

    # A recovery that dies midway (its sink's server gone, say) is on record: the audit row came with the take.
    ops = pipeline_operations(actor="tester@here")
    ops.connections = SinkDiesInRecovery(ops.connections)  # type: ignore[assignment]
    with pytest.raises(KilledMidRecovery):
        ops.recover(pipeline, apply=True, reason="first try")
    assert our_prepared_branches(mysql_kwargs, pipeline) == prepared
    [started] = eo_json("history", pipeline)["audit"]
    assert (started["action"], started["reason"], started["epoch"], started["actor"]) == (
        "recover", "first try", 2, "tester@here")
    assert started["details"]["completed"] is False and started["changes"][0].startswith("started, not completed")
    assert {b["action"] for b in started["details"]["branches"]} == {"commit"}

    done = eo_json("recover", pipeline, "--apply", "--reason", "in-doubt after a crash")
    assert not done["dry_run"] and done["epoch"] == 3 and done["left_in_doubt"] == []
    assert our_prepared_branches(mysql_kwargs, pipeline) == []
    pv = dict(rows(mysql_kwargs, f"SELECT app_id, pv FROM {table}"))
    assert pv == page_views.ground_truth(bootstrap, topic_name)[0]  # the committed batch's rows, once
    assert pv == Counter(e["app_id"] for e in events)

    before = store_state(mysql_kwargs, pipeline)
    refused = eo("rewind", pipeline, "--to-earliest", "--apply", "--reason", "again")
    assert refused.returncode != 0 and DOUBLE_COUNT_FLAG in refused.stderr and "MySqlXaSink" in refused.stderr
    assert store_state(mysql_kwargs, pipeline) == before

    history = eo_json("history", pipeline)
    assert [(b["batch_id"], b["state"], b["records_in"]) for b in history["batches"]] == [(0, "committed", 200)]
    audit, first = history["audit"]
    assert audit["action"] == "recover" and audit["reason"] == "in-doubt after a crash" and "@" in audit["actor"]
    assert audit["epoch"] == 3 and audit["details"]["completed"] is True and first["reason"] == "first try"
    assert {b["action"] for b in audit["details"]["branches"]} == {"commit"}
    assert sorted(audit["changes"]) == sorted(f"branch {xid}: commit" for xid in prepared)
    human = eo("history", pipeline)
    assert human.returncode == 0 and f"branch {prepared[0]}: commit" in human.stdout
    listed = {p["pipeline_id"]: p for p in eo_json("pipelines")}
    assert listed[pipeline]["last_state"] == "committed" and listed[pipeline]["lag"] == 0
    assert listed[pipeline]["sink"] == "MySqlXaSink"

    # Overridden, the rewind goes through, and the audit row says what was overridden.
    overridden = eo_json("rewind", pipeline, "--to-earliest", "--apply", "--reason", "recount", DOUBLE_COUNT_FLAG)
    assert overridden["applied"] is True
    rewound = eo_json("history", pipeline)["audit"][0]
    assert (rewound["action"], rewound["reason"], rewound["details"]["overrides"]) == (
        "rewind", "recount", [DOUBLE_COUNT_FLAG])
    assert f"overridden: {DOUBLE_COUNT_FLAG}" in rewound["changes"]


def test_a_rewind_is_a_dry_run_until_applied_audited_and_the_next_run_reprocesses_exactly_its_range(
        bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 1)  # one partition: event i is at offset i
    events = produce_page_views(bootstrap, 60, topic=topic_name, raw_values=[BAD_RECORD],
                                raw_headers=[[("source", b"app\xff"), ("retry", None)]])
    table = events_table(mysql_kwargs)
    pipeline = f"ops_upsert_{topic_name}"
    op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]), pipeline_id=pipeline,
                  on_bad_record="dead_letter")
    first = run(op, "run-1")
    assert (first["records_in"], first["rows_out"], first["dead_letters"]) == (61, 60, 1)

    [dead] = eo_json("dead-letters", pipeline)
    assert (dead["batch_id"], dead["partition"], dead["offset"], dead["value"]) == (0, 0, 60, "{not json")
    assert "malformed" in dead["error"]
    assert dead["headers"] == [{"key": "source", "value": "app\ufffd"}, {"key": "retry", "value": None}]  # as text
    human = eo("dead-letters", pipeline)
    assert human.returncode == 0 and "source=app\ufffd, retry=null" in human.stdout, human.stdout

    to_offsets = json.dumps({topic_name: {"0": 40}})
    before = store_state(mysql_kwargs, pipeline)
    plan = eo_json("rewind", pipeline, "--to-offsets", to_offsets)  # a dry run by default
    assert plan["applied"] is False and plan["refused"] is None and plan["reprocessed"] == 21
    assert [(p["partition"], p["old"], p["new"]) for p in plan["partitions"]] == [(0, 61, 40)]
    assert store_state(mysql_kwargs, pipeline) == before

    # The sink lost rows 40..59 (a bad restore, a manual delete): the rewind writes them again.
    lost = [e["event_id"] for e in events[40:]]
    rows(mysql_kwargs, f"DELETE FROM {table} WHERE event_id IN ({', '.join(['%s'] * len(lost))})", tuple(lost))
    applied = eo_json("rewind", pipeline, "--to-offsets", to_offsets, "--apply", "--reason", "rows 40.. lost")
    assert applied["applied"] is True and applied["epoch"] == before[1][0][0] + 1
    assert rows(mysql_kwargs, "SELECT next_offset FROM eo_offset WHERE pipeline_id = %s", (pipeline,)) == [(40,)]

    history = eo_json("history", pipeline)
    [audit] = history["audit"]
    assert (audit["action"], audit["reason"], audit["epoch"]) == ("rewind", "rows 40.. lost", applied["epoch"])
    assert [(p["old"], p["new"]) for p in audit["details"]["partitions"]] == [(61, 40)]
    assert audit["details"]["overrides"] == [] and audit["changes"] == [f"{topic_name}[0] 61 -> 40"]
    human = eo("history", pipeline)
    assert human.returncode == 0 and "rows 40.. lost" in human.stdout and "61 -> 40" in human.stdout

    again = run(op, "run-2")
    assert again["ranges"] == [{"topic": topic_name, "partition": 0, "from_offset": 40, "until_offset": 61}]
    assert (again["records_in"], again["rows_out"], again["dead_letters"]) == (21, 20, 1)
    records, _ = read_topic(bootstrap, topic_name)  # the ground truth, read from the topic
    truth = {json.loads(value)["event_id"] for _, value in records if value != BAD_RECORD}
    assert {r[0] for r in rows(mysql_kwargs, f"SELECT event_id FROM {table}")} == truth
    assert truth == {e["event_id"] for e in events}
    assert rows(mysql_kwargs, "SELECT next_offset FROM eo_offset WHERE pipeline_id = %s", (pipeline,)) == [(61,)]


def test_unknown_pipelines_and_bad_arguments_fail_clearly():
    """(Every bad rewind argument: tests/operators/test_sink_records_and_metrics.py, in process.)"""
    missing = f"no_such_pipeline_{uuid.uuid4().hex[:6]}"
    for args in (["status", missing], ["rewind", missing, "--to-earliest"]):
        done = eo(*args)
        assert done.returncode != 0 and f"the offset store has no pipeline '{missing}'" in done.stderr, done
    for args, words in ((["rewind", missing, "--to-offsets", "{nope"], "--to-offsets is not JSON"),
                        (["history", missing, "--limit", "0"], "invalid positive int value")):
        done = eo(*args)
        assert done.returncode != 0 and words in done.stderr, (args, done.stderr[-2000:])


class BatchStartsDuringRewind:
    """The real store, with an attempt that plans a batch between the first rewind's plan and its store
    transaction."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def rewind(self, plan: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.raced:
            self.raced = True
            epoch = self._store.take_pipeline(plan.pipeline_id)
            self._store.insert_batch(plan.pipeline_id, epoch, "run-racing",
                                     [OffsetRange(plan.changes[0].topic, 0, 5, 9)], [])
        return self._store.rewind(plan, *args, **kwargs)


def test_a_rewind_refused_under_the_store_lock_leaves_the_kafka_group_where_it_was(bootstrap, mysql_kwargs):
    """The store's check runs before the Kafka sink's consumer group moves (issue 23, item 8): a refused rewind
    leaves the group alone, also on a partition the pipeline never committed (it has no group offset to go
    back to)."""
    pipeline = f"rw_{uuid.uuid4().hex[:8]}"
    topic = create_topic(bootstrap, f"{pipeline}_in", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        producer.produce(topic, b"x", partition=i % 2)
    producer.flush(30)
    spec = KafkaTransactionalSink(topic=f"{pipeline}_out")
    store = SqlOffsetStore(MYSQL, mysql_kwargs)
    store.migrate()
    epoch = store.take_pipeline(pipeline, sink=spec.record())
    batch = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange(topic, 0, 0, 5)], [])
    store.commit_batch(batch, epoch, BatchSummary.of(batch, "run-1", epoch))
    adapter = kafka_adapter(bootstrap, pipeline, spec)
    adapter.move_group_offsets({(topic, 0): 5})  # where the batch's transaction left the group

    class Connections:
        def store(self) -> Any:
            return BatchStartsDuringRewind(SqlOffsetStore(MYSQL, mysql_kwargs))

        def offset_source(self) -> Any:
            return KafkaOffsetSource({"bootstrap.servers": bootstrap})

        def sink(self, pipeline_id: str, record: Any) -> Any:
            return kafka_adapter(bootstrap, pipeline_id, spec)

    ops = PipelineOperations(Connections(), "tester")
    target = RewindTarget(RewindKind.OFFSETS, offsets={(topic, 0): 7, (topic, 1): 3})  # forward: no double count
    assert ops.rewind(pipeline, target).refusal is None  # the dry run sees no unfinished batch
    with pytest.raises(OperationError, match="unfinished batch"):
        ops.rewind(pipeline, target, apply=True, reason="replay")
    assert adapter.group_offsets([(topic, 0), (topic, 1)]) == {(topic, 0): 5}
    assert store.committed_offsets(pipeline) == {(topic, 0): 5} and store.audit_log(pipeline, 5) == []
    # Once the racing batch is over, the rewind goes through: the store and the group move together.
    [batch] = store.unfinished_batches(pipeline)
    store.abort_batch(batch, store.pipeline(pipeline).epoch)
    assert ops.rewind(pipeline, target, apply=True, reason="replay").applied
    assert adapter.group_offsets([(topic, 0), (topic, 1)]) == {(topic, 0): 7, (topic, 1): 3}
    assert store.committed_offsets(pipeline) == {(topic, 0): 7, (topic, 1): 3}
