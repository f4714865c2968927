"""The decisions behind ``airflow eo`` (``airflow_eo.core.recovery``, ``rewind``, ``status``) and the recovery it
shares with a task attempt (``protocol.recover_pipeline``), as plain code against the fakes of
``tests/core/fakes/``."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

import airflow_eo.integrations  # noqa: F401 (registers the built-in sink kinds: capabilities_of answers)
from airflow_eo.cli.arguments import parse_offsets
from airflow_eo.core import protocol
from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import OperationError
from airflow_eo.core.pipeline_status import PartitionStatus, partition_status
from airflow_eo.core.planning import PartitionOffsets
from airflow_eo.core.protocol import recover_pipeline
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.recovery import BatchAction, BranchAction, committed_by_kafka, decide_branch, decide_unfinished
from airflow_eo.core.rewind import DOUBLE_COUNT_FLAG, RewindKind, RewindTarget, check_rewind, plan_rewind
from airflow_eo.core.xid import Xid, pipeline_key
from tests.core.fakes.processes import Killed, Process, failpoint
from tests.core.fakes.source import Record
from tests.core.fakes.world import World

P, T = "p", "t"
KEY = pipeline_key(P)


@pytest.fixture(autouse=True)
def _crash_points(monkeypatch):
    monkeypatch.setattr(protocol, "failpoint", failpoint)


def batch(batch_id: int, state: BatchState, xids: list[str] = (), ranges: list[OffsetRange] = ()) -> BatchRecord:
    return BatchRecord(P, batch_id, f"run-{batch_id}", 1, state, list(ranges), xids=list(xids))


# --------------------------------------------------------------------------- in-doubt branches


def test_a_branch_is_committed_only_when_its_batch_committed_and_recorded_it():
    xid = Xid(KEY, 3, 2, 0)
    recorded = batch(3, BatchState.COMMITTED, [xid.encode()])
    decision = decide_branch(xid, recorded)
    assert decision.action is BranchAction.COMMIT and "commit point" in decision.reason
    assert (decision.xid, decision.batch_id, decision.epoch, decision.partition) == (xid.encode(), 3, 2, 0)

    stray = Xid(KEY, 3, 1, 0)  # an older attempt's branch of the same batch
    assert decide_branch(stray, recorded).action is BranchAction.ROLLBACK
    assert "without this branch" in decide_branch(stray, recorded).reason
    for state, words in ((BatchState.PREPARED, "never reached its commit point"),
                         (BatchState.PLANNED, "never reached its commit point"), (BatchState.ABORTED, "aborted")):
        decision = decide_branch(xid, batch(3, state, [xid.encode()]))
        assert decision.action is BranchAction.ROLLBACK and words in decision.reason, state
    assert decide_branch(xid, None).action is BranchAction.ROLLBACK
    assert "not in the offset store" in decide_branch(xid, None).reason


def test_kafka_committed_a_batch_when_its_group_reached_the_end_of_every_non_empty_range():
    a = batch(1, BatchState.PLANNED, ranges=[OffsetRange(T, 0, 0, 5), OffsetRange(T, 1, 3, 3)])
    b = batch(2, BatchState.PLANNED, ranges=[OffsetRange(T, 0, 5, 9)])
    empty = batch(3, BatchState.PLANNED, ranges=[OffsetRange(T, 0, 9, 9)])
    assert committed_by_kafka([a, b, empty], {(T, 0): 5}) == {1}
    assert committed_by_kafka([a, b, empty], {(T, 0): 9}) == {2}
    assert committed_by_kafka([a], {}) == set()
    assert decide_unfinished(a, {1})[0] is BatchAction.ROLL_FORWARD
    assert decide_unfinished(b, {1})[0] is BatchAction.ABORT


# --------------------------------------------------------------------------- recover_pipeline


def test_recovery_without_a_run_commits_the_branches_of_a_committed_batch_and_aborts_an_unfinished_one():
    world = World("xa")
    world.produce(0, 4)
    world.produce(1, 2)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="crash:after_commit_point"))  # committed, XA COMMIT missing
    assert world.server.prepared and world.exactly_once_problems()
    world.produce(0, 3)
    with pytest.raises(Killed):
        world.attempt("r2", Process(kill_at="crash:after_prepare"))  # prepared, never committed
    [left] = world.store.unfinished_batches(P)

    epoch = world.store.take_pipeline(P)
    recovery = recover_pipeline(world.store, world.sink(Process()), P, epoch)
    assert recovery == protocol.Recovery(aborted=(left.batch_id,))
    assert world.store.get_batch(P, left.batch_id).state == BatchState.ABORTED
    assert not world.server.prepared  # every branch resolved: r1's committed, r2's rolled back
    assert world.exactly_once_problems(fakes_records(world, 0, 4) + fakes_records(world, 1, 2)) == []
    summary = world.attempt("r2")  # r2's retry plans its records again
    assert not summary.resumed and world.exactly_once_problems() == []


def fakes_records(world: World, partition: int, count: int) -> list[Record]:
    return [r for r in world.source.records() if r.partition == partition][:count]


def test_recovery_without_a_run_rolls_forward_what_the_kafka_sink_committed():
    world = World("kafka")
    world.produce(0, 3)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="kafka.committed"))
    [left] = world.store.unfinished_batches(P)
    epoch = world.store.take_pipeline(P)
    recovery = recover_pipeline(world.store, world.sink(Process()), P, epoch)
    assert recovery.rolled_forward == (left.batch_id,) and recovery.aborted == ()
    assert world.store.get_batch(P, left.batch_id).summary.rolled_forward
    assert world.store.committed_offsets(P) == {(T, 0): 3, (T, 1): 0}
    assert world.exactly_once_problems() == []


def test_a_take_records_the_sink_for_operations():
    world = World("upsert")
    sink = SinkRecord("MySqlUpsertSink", accumulating=False, conn_id="mysql_default", target="t",
                      dead_letter_table="eo_dead_letter", options={"table": "t", "key_columns": ["k"]})
    world.attempt("r1", sink=sink)
    assert world.store.pipelines[P]["sink"] == sink
    assert SinkRecord.from_json(sink.to_json()) == sink


# --------------------------------------------------------------------------- partitions


def test_lag_counts_from_the_committed_offset_or_the_log_start_and_lost_offsets_apart():
    parts = [PartitionOffsets(T, 0, 0, 10, 0), PartitionOffsets(T, 1, 50, 60, 0), PartitionOffsets(T, 2, 5, 7, 0)]
    found = partition_status(parts, {(T, 0): 4, (T, 1): 20, ("gone", 0): 3})
    assert [(p.topic, p.partition, p.committed, p.lag, p.lost) for p in found] == [
        ("gone", 0, 3, None, 0), (T, 0, 4, 6, 0), (T, 1, 20, 10, 30), (T, 2, None, 2, 0)]
    assert partition_status(None, {(T, 0): 4}) == [PartitionStatus(T, 0, 4, None, None)]


# --------------------------------------------------------------------------- rewind

BROKER = [PartitionOffsets(T, 0, 10, 100, 0), PartitionOffsets(T, 1, 0, 50, 0)]
COMMITTED = {(T, 0): 80, (T, 1): 50}


def test_rewind_targets_and_what_they_reprocess_or_skip():
    earliest = plan_rewind(P, RewindTarget(RewindKind.EARLIEST), BROKER, COMMITTED)
    assert [(c.old, c.new) for c in earliest.changes] == [(80, 10), (50, 0)]
    assert [c.reprocessed for c in earliest.changes] == [OffsetRange(T, 0, 10, 80), OffsetRange(T, 1, 0, 50)]
    assert earliest.reprocesses and earliest.to_dict()["reprocessed"] == 120

    latest = plan_rewind(P, RewindTarget(RewindKind.LATEST), BROKER, COMMITTED)
    assert [c.skipped for c in latest.changes] == [OffsetRange(T, 0, 80, 100), None]
    assert not latest.reprocesses and [c.partition for c in latest.moved] == [0]

    offsets = plan_rewind(P, RewindTarget(RewindKind.OFFSETS, offsets={(T, 0): 70}), BROKER, COMMITTED)
    assert [(c.partition, c.old, c.new) for c in offsets.changes] == [(0, 80, 70), (1, 50, 50)]
    assert str(offsets.target) == "offsets t[0]=70"

    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    by_time = plan_rewind(P, RewindTarget(RewindKind.DATETIME, at=at), BROKER, {(T, 0): 80},
                          at_time={(T, 0): 60, (T, 1): 20})
    assert [(c.old, c.new) for c in by_time.changes] == [(80, 60), (None, 20)]  # never committed: a new row
    assert by_time.changes[1].reprocessed is None and by_time.changes[1].skipped is None


def test_rewind_targets_outside_what_the_broker_holds_are_refused():
    with pytest.raises(OperationError, match=r"t\[0\] offset 5 is below the log-start offset 10"):
        plan_rewind(P, RewindTarget(RewindKind.OFFSETS, offsets={(T, 0): 5}), BROKER, COMMITTED)
    with pytest.raises(OperationError, match=r"beyond the last stable offset 50"):
        plan_rewind(P, RewindTarget(RewindKind.OFFSETS, offsets={(T, 1): 51}), BROKER, COMMITTED)
    with pytest.raises(OperationError, match=r"reads no partition t\[7\]; its partitions are t\[0\], t\[1\]"):
        plan_rewind(P, RewindTarget(RewindKind.OFFSETS, offsets={(T, 7): 1}), BROKER, COMMITTED)


def test_offsets_json_is_checked():
    assert parse_offsets('{"t": {"0": 5, "1": 0}}') == {(T, 0): 5, (T, 1): 0}
    for bad, words in (("nope", "not JSON"), ("[1]", "JSON object"), ('{"t": 5}', "map partitions"),
                       ('{"t": {"x": 5}}', "non-negative integers"), ('{"t": {"0": -1}}', "non-negative"),
                       ('{"t": {"0": true}}', "non-negative")):
        with pytest.raises(OperationError, match=words):
            parse_offsets(bad)


XA_ADD = SinkRecord("MySqlXaSink", accumulating=True, target="app_pv")
UPSERT = SinkRecord("MySqlUpsertSink", accumulating=False, target="events")


def test_a_rewind_is_refused_while_a_batch_is_unfinished_in_interval_mode_and_into_accumulating_sinks():
    back = plan_rewind(P, RewindTarget(RewindKind.EARLIEST), BROKER, COMMITTED)
    forward = plan_rewind(P, RewindTarget(RewindKind.LATEST), BROKER, COMMITTED)
    check_rewind(back, Mode.CONTINUOUS, [], UPSERT, False)  # overwriting: reprocessing is harmless
    check_rewind(forward, Mode.CONTINUOUS, [], XA_ADD, False)  # skipping counts nothing twice
    check_rewind(back, Mode.CONTINUOUS, [], XA_ADD, True)  # asked for
    with pytest.raises(OperationError, match=f"adds to existing rows.*{DOUBLE_COUNT_FLAG}"):
        check_rewind(back, Mode.CONTINUOUS, [], XA_ADD, False)
    with pytest.raises(OperationError, match="appends its output"):
        check_rewind(back, Mode.CONTINUOUS, [], SinkRecord("KafkaTransactionalSink", accumulating=True), False)
    with pytest.raises(OperationError, match="does not know"):
        check_rewind(back, Mode.CONTINUOUS, [], None, False)
    with pytest.raises(OperationError, match=r"unfinished batch: 4 \(prepared, run run-4\)"):
        check_rewind(back, Mode.CONTINUOUS, [batch(4, BatchState.PREPARED)], UPSERT, True)
    with pytest.raises(OperationError, match="interval mode"):
        check_rewind(back, Mode.INTERVAL, [], UPSERT, True)


# --------------------------------------------------------------------------- what notes say of errors


class _UnreachableKafka:
    """No store needed; a Kafka whose error names a host and a user."""

    def store(self):
        return None

    def offset_source(self):
        raise ConnectionError("cannot reach broker-7.internal.example:9093 as sasl user alice")

    def sink(self, pipeline_id, record):
        raise AssertionError("not used")


def test_a_dependencys_error_text_reaches_the_cli_notes_but_only_its_kind_and_a_reference_reach_the_tab(caplog):
    from airflow_eo.ops.service import PipelineOperations

    _, cli = PipelineOperations(_UnreachableKafka(), "tester").context.broker_offsets([T])
    assert cli is not None and "broker-7.internal.example" in cli

    with caplog.at_level("WARNING", logger="airflow_eo.ops.context"):
        _, tab = PipelineOperations(_UnreachableKafka(), "airflow-ui", error_details=False).context.broker_offsets([T])
    assert tab is not None and tab.startswith("Kafka offsets unknown: ConnectionError") and "reference" in tab
    assert "internal.example" not in tab and "alice" not in tab
    reference = tab.rsplit("reference ", 1)[1].rstrip(")")
    logged = [r for r in caplog.records if reference in r.getMessage()]
    assert logged and "broker-7.internal.example" in str(logged[0].exc_info[1])  # the text is in the log
