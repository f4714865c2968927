"""The commit protocol (``airflow_eo.core.protocol``) against in-memory fakes (``tests/core/fakes/``).

Every branch of ``run_batch`` / ``run_interval_batch`` in milliseconds, fencing at every store write, and
random interleavings of crashes, failures, zombie attempts and clears checked for exactly-once.

A crash is a :class:`~tests.core.fakes.processes.Killed` raised at a step of the attempt's process (the protocol's own
failpoints via a patched ``protocol.failpoint``, the engine's and the sinks' steps, before and after every
store write); nothing of a killed attempt runs afterwards, not even ``Sink.discard``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from airflow_eo.core import protocol
from airflow_eo.core.batch import BatchSummary, Owner, RunRequest
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode
from airflow_eo.core.errors import (
    CommitConflictError,
    ConfigurationError,
    DataLossError,
    FencedError,
    IntervalNotReadyError,
    PipelineConflictError,
)
from airflow_eo.core.planning import Interval
from airflow_eo.core.protocol import run_interval_batch
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.xid import Xid
from tests.core.fakes.engine import FakeEngine
from tests.core.fakes.processes import RUNNING, InjectedError, Killed, Process, failpoint
from tests.core.fakes.sinks import FakeUpsertSink, ProducerFencedError, UpsertTable
from tests.core.fakes.source import FakeSource, Record
from tests.core.fakes.store import DuplicateKeyError, FakeStore
from tests.core.fakes.world import SINK_KINDS, World

P, T = "p", "t"
T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
MINUTE, HOUR = timedelta(minutes=1), timedelta(hours=1)
COMMITTED = BatchState.COMMITTED


@pytest.fixture(autouse=True)
def _crash_points(monkeypatch):
    """The protocol's failpoints (``failpoint``) become steps of the running attempt's fake process."""
    monkeypatch.setattr(protocol, "failpoint", failpoint)
    yield
    assert not RUNNING


def R(partition: int, start: int, end: int) -> OffsetRange:
    return OffsetRange(T, partition, start, end)


def hour(h: int) -> Interval:
    return Interval(T0 + h * HOUR, T0 + (h + 1) * HOUR)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def records_in(world: World, ranges) -> list[Record]:
    return [rec for r in ranges for rec in world.source.logs[r.key][r.from_offset:r.until_offset]]


def without_seconds(summary: BatchSummary) -> BatchSummary:
    """The returned summary adds the commit and finalize timings to the recorded one."""
    return replace(summary, seconds={})


def interval_world() -> World:
    """An upsert pipeline whose records carry timestamps: hour 0 = offsets [0,3) / [0,1), hour 1 = [3,5) / [1,3);
    hour 2 is not complete (no record at or after its end yet)."""
    world = World("upsert")
    for partition, minutes in ((0, (5, 20, 50, 70, 95, 130)), (1, (10, 65, 70, 125))):
        for minute in minutes:
            world.produce(partition, timestamp_ms=ms(T0 + minute * MINUTE))
    return world


# --------------------------------------------------------------------------- continuous mode


@pytest.mark.parametrize("starting, expected", [
    ("earliest", [R(0, 0, 5), R(1, 0, 3)]),
    ("latest", [R(0, 5, 5), R(1, 3, 3)]),
    (7_000, [R(0, 5, 5), R(1, 1, 3)]),  # p0 holds 1000..5000 (none >= 7000: its end), p1 6000..8000
], ids=["earliest", "latest", "timestamp"])
def test_the_first_batch_plans_from_the_starting_offsets_and_commits(starting, expected):
    world = World("xa")
    world.produce(0, 5)
    world.produce(1, 3)
    proc = Process()
    summary = world.attempt("r1", proc, starting_offsets=starting)

    n = sum(r.size for r in expected)
    assert (summary.pipeline_id, summary.batch_id, summary.run_id, summary.epoch) == (P, 0, "r1", 1)
    assert list(summary.ranges) == expected and summary.skipped == () and summary.mode is Mode.CONTINUOUS
    assert (summary.records_in, summary.rows_out) == (n, n)
    assert not (summary.resumed or summary.replayed or summary.already_committed or summary.rolled_forward)
    [batch] = world.store.all_batches(P)
    assert batch.state == COMMITTED and batch.ranges == expected and batch.run_id == "r1"
    assert without_seconds(batch.summary) == without_seconds(summary)
    assert world.store.committed_offsets(P) == {r.key: r.until_offset for r in expected}
    assert world.exactly_once_problems(records_in(world, expected)) == []
    assert len(proc.engine.calls) == (1 if n else 0)


def test_the_next_batch_starts_exactly_where_the_last_one_ended():
    world = World("xa")
    world.produce(0, 4)
    world.produce(1, 2)
    first = world.attempt("r1")
    world.produce(0, 3)
    world.produce(1, 1)
    second = world.attempt("r2")

    assert list(first.ranges) == [R(0, 0, 4), R(1, 0, 2)]
    assert list(second.ranges) == [R(0, 4, 7), R(1, 2, 3)]
    assert (second.batch_id, second.epoch) == (first.batch_id + 1, first.epoch + 1)
    assert world.store.committed_offsets(P) == {(T, 0): 7, (T, 1): 3}
    assert world.exactly_once_problems() == []


@pytest.mark.parametrize("kill_at", ["crash:after_plan", "engine.read", "xa.prepared", "engine.written",
                                     "store.mark_prepared:done", "crash:after_prepare", "store.commit_batch"])
def test_a_retry_resumes_its_unfinished_batch_with_the_recorded_ranges(kill_at):
    world = World("xa")
    world.produce(0, 4)
    world.produce(1, 2)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at=kill_at))
    [left] = world.store.unfinished_batches(P)
    assert world.visible() == Counter()  # nothing counts before the commit point
    world.produce(0, 5)  # arrives before the retry: the retry must not read it

    retry = world.attempt("r1")
    assert retry.resumed and not retry.already_committed
    assert (retry.batch_id, retry.epoch) == (left.batch_id, 2)
    assert list(retry.ranges) == left.ranges == [R(0, 0, 4), R(1, 0, 2)]
    [batch] = world.store.all_batches(P)
    assert batch.state == COMMITTED and batch.summary.resumed
    assert world.store.committed_offsets(P) == {(T, 0): 4, (T, 1): 2}
    assert world.exactly_once_problems(records_in(world, left.ranges)) == []  # also: no prepared branch left


def test_another_runs_unfinished_batch_is_aborted_its_branches_rolled_back_and_a_fresh_batch_planned():
    world = World("xa")
    world.produce(0, 4)
    world.produce(1, 2)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="crash:after_prepare"))
    [left] = world.store.unfinished_batches(P)
    assert left.state == BatchState.PREPARED and sorted(left.xids) == sorted(world.server.prepared)
    world.produce(1, 3)

    summary = world.attempt("r2")
    aborted = world.store.get_batch(P, left.batch_id)
    assert aborted.state == BatchState.ABORTED and aborted.epoch == summary.epoch
    assert world.store.batch_for_run(P, "r1") is None  # run_key NULL: the run is free again
    assert set(left.xids) <= set(world.server.rolled_back)
    assert summary.batch_id == left.batch_id + 1 and not summary.resumed
    assert list(summary.ranges) == [R(0, 0, 4), R(1, 0, 5)]
    assert world.exactly_once_problems() == []

    world.produce(0, 1)
    again = world.attempt("r1")  # the aborted run, cleared: plans a fresh batch
    assert not again.resumed and again.batch_id == summary.batch_id + 1
    assert list(again.ranges) == [R(0, 4, 5), R(1, 5, 5)]
    assert world.exactly_once_problems() == []


def test_a_batch_only_the_kafka_sink_committed_is_rolled_forward_and_the_next_run_continues_after_it():
    world = World("kafka")
    world.produce(0, 3)
    world.produce(1, 2)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="kafka.committed"))  # Kafka committed, the store did not mirror it
    [left] = world.store.unfinished_batches(P)
    assert world.exactly_once_problems() == []  # the sink's commit point passed: its output is visible once
    assert world.server.group_offsets == {(T, 0): 3, (T, 1): 2} and world.store.committed_offsets(P) == {}
    world.produce(0, 2)

    summary = world.attempt("r2")
    rolled = world.store.get_batch(P, left.batch_id)
    assert rolled.state == COMMITTED and rolled.run_id == "r1" and rolled.epoch == summary.epoch
    assert rolled.summary.rolled_forward and rolled.summary.run_id == "r1" and rolled.ranges == left.ranges
    assert summary.batch_id == left.batch_id + 1 and not summary.rolled_forward
    assert list(summary.ranges) == [R(0, 3, 5), R(1, 2, 2)]
    assert world.store.committed_offsets(P) == {(T, 0): 5, (T, 1): 2}
    assert world.exactly_once_problems() == []

    retry = world.attempt("r1")  # the killed run's retry: its batch is done
    assert retry.already_committed and retry.rolled_forward and retry.batch_id == left.batch_id


def test_the_retry_of_a_run_whose_batch_only_kafka_committed_rolls_it_forward_and_does_nothing_else():
    world = World("kafka")
    world.produce(0, 3)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="kafka.committed"))
    output = list(world.server.output)
    proc = Process()
    retry = world.attempt("r1", proc)
    assert retry.already_committed and retry.rolled_forward and retry.epoch == 2
    assert proc.engine.calls == [] and proc.sink.writes == [] and world.server.output == output
    assert world.store.committed_offsets(P) == {(T, 0): 3, (T, 1): 0}
    assert world.exactly_once_problems() == []


@pytest.mark.parametrize("kind", SINK_KINDS)
def test_a_cleared_run_that_already_committed_returns_its_recorded_summary_and_writes_nothing(kind):
    world = World(kind)
    world.produce(0, 3)
    world.produce(1, 1)
    first = world.attempt("r1")
    world.produce(0, 2)
    before = (world.visible(), world.store.all_batches(P), world.store.committed_offsets(P))

    proc = Process()
    again = world.attempt("r1", proc)
    assert again.already_committed
    assert without_seconds(replace(again, already_committed=False)) == without_seconds(first)
    assert proc.engine.calls == [] and proc.sink.writes == []
    assert (world.visible(), world.store.all_batches(P), world.store.committed_offsets(P)) == before


@pytest.mark.parametrize("kill_at", ["crash:after_commit_point", ("xa.commit", 2)])
def test_a_crash_after_the_commit_point_is_finished_by_the_next_attempts_recovery(kill_at):
    world = World("xa")
    world.produce(0, 4)
    world.produce(1, 4)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at=kill_at))
    [batch] = world.store.committed_batches(P)
    assert len(batch.xids) == 2 and world.server.prepared  # committed, not (fully) visible yet
    assert world.exactly_once_problems() != []

    retry = world.attempt("r1")  # the task's retry: recovery commits the recorded branches
    assert retry.already_committed and retry.batch_id == batch.batch_id
    assert world.exactly_once_problems() == []


def test_pipelines_whose_short_keys_collide_never_touch_each_others_branches(monkeypatch):
    """Two pipelines writing to one XA database, their ids' SHA-1 equal in the first 48 bits (the gtrid's key
    before issue 23 item 11): one's recovery neither commits nor rolls back the other's prepared branches."""
    from airflow_eo.core import xid as xid_module

    class CollidingSha1:  # the first 12 hex digits of every digest alike, the rest the real SHA-1's
        def __init__(self, data: bytes) -> None:
            self.real = hashlib.sha1(data)

        def hexdigest(self) -> str:
            return "0" * 12 + self.real.hexdigest()[12:]

    monkeypatch.setattr(xid_module, "hashlib", SimpleNamespace(sha1=CollidingSha1))
    a = World("xa", topic="ta", pipeline_id="a")
    b = World("xa", topic="tb", pipeline_id="b")
    b.server = a.server  # one database
    b.produce(0, 3)
    with pytest.raises(Killed):
        b.attempt("r1", Process(kill_at="crash:after_commit_point"))
    left_by_b = sorted(a.server.prepared)
    assert len(left_by_b) == 1
    a.produce(0, 4)
    a.produce(1, 2)
    a.attempt("r1")  # its recovery must leave b's branch alone
    assert sorted(a.server.prepared) == left_by_b and not set(left_by_b) & set(a.server.rolled_back)
    assert b.attempt("r1").already_committed  # b's retry commits its own branch
    assert a.exactly_once_problems([*a.source.records(), *b.source.records()]) == []  # the one database: both


def test_a_failure_after_execution_discards_the_prepared_branches_and_a_retry_commits():
    world = World("xa")
    world.produce(0, 3)
    world.produce(1, 3)
    proc = Process(fail_at="store.mark_prepared")  # e.g. the store's connection fails before the write
    with pytest.raises(InjectedError):
        world.attempt("r1", proc)
    [discarded] = proc.sink.discarded
    assert discarded and set(discarded) <= set(world.server.rolled_back) and world.server.prepared == {}
    assert world.visible() == Counter()
    [left] = world.store.unfinished_batches(P)

    retry = world.attempt("r1")
    assert retry.resumed and retry.batch_id == left.batch_id
    assert world.exactly_once_problems() == []


def test_a_failed_store_commit_leaves_the_branches_to_the_next_attempts_recovery():
    """The store's commit may have taken effect when it raises: no discard; recovery decides from the store."""
    world = World("xa")
    world.produce(0, 3)
    world.produce(1, 3)
    proc = Process(fail_at="store.commit_batch")  # raised before the commit took effect
    with pytest.raises(InjectedError):
        world.attempt("r1", proc)
    assert proc.sink.discarded == [] and world.server.prepared != {} and world.visible() == Counter()
    [left] = world.store.unfinished_batches(P)

    retry = world.attempt("r1")  # recovery rolls the branches back (batch not committed), then resumes
    assert retry.resumed and retry.batch_id == left.batch_id
    assert world.server.prepared == {} and world.exactly_once_problems() == []


def test_an_engine_failure_commits_nothing_and_a_retry_commits():
    world = World("xa")
    world.produce(0, 3)
    world.produce(1, 3)
    with pytest.raises(InjectedError):
        world.attempt("r1", Process(fail_at="engine.written"))  # the sink prepared its branches, then Spark failed
    [left] = world.store.unfinished_batches(P)
    assert left.state == BatchState.PLANNED and world.visible() == Counter()

    retry = world.attempt("r1")
    assert retry.resumed and retry.batch_id == left.batch_id
    assert world.exactly_once_problems() == []  # the next attempt's recovery rolled the branches back


def test_an_engine_failure_discards_the_branches_the_sink_prepared():
    world = World("xa")
    world.produce(0, 3)
    world.produce(1, 3)
    proc = Process(fail_at="engine.written")
    with pytest.raises(InjectedError):
        world.attempt("r1", proc)
    assert world.server.prepared == {}, f"left prepared: {sorted(world.server.prepared)}"


def test_an_error_after_the_store_committed_leaves_the_batch_applied_exactly_once():
    world = World("xa")
    world.produce(0, 3)
    world.produce(1, 3)
    with pytest.raises(InjectedError):
        world.attempt("r1", Process(fail_at="store.commit_batch:done"))
    [batch] = world.store.committed_batches(P)  # the commit point passed
    retry = world.attempt("r1")
    assert retry.already_committed and retry.batch_id == batch.batch_id
    assert world.exactly_once_problems() == []


@pytest.mark.parametrize("kind", SINK_KINDS)
def test_an_empty_batch_commits_its_offsets_without_calling_the_engine(kind):
    world = World(kind)
    proc = Process()
    summary = world.attempt("r1", proc)
    assert list(summary.ranges) == [R(0, 0, 0), R(1, 0, 0)] and summary.records_in == 0
    assert proc.engine.calls == [] and proc.sink.writes == []
    assert world.store.committed_batches(P)[0].batch_id == summary.batch_id
    assert world.store.committed_offsets(P) == {(T, 0): 0, (T, 1): 0}

    world.produce(0, 2)
    world.attempt("r2")
    proc = Process()
    caught_up = world.attempt("r3", proc)  # nothing new: empty again
    assert list(caught_up.ranges) == [R(0, 2, 2), R(1, 0, 0)] and proc.engine.calls == []
    assert world.exactly_once_problems() == []
    if kind == "kafka":
        assert world.server.aborted == 0 and world.server.group_offsets == {(T, 0): 2}  # no transaction for nothing


def test_max_records_per_run_caps_the_batch_and_shares_it_by_lag():
    world = World("xa", partitions=3)
    world.produce(0, 30)
    world.produce(1, 10)
    first = world.attempt("r1", max_records_per_run=8)
    assert list(first.ranges) == [R(0, 0, 6), R(1, 0, 2), R(2, 0, 0)]  # lags 30 / 10 / 0 → 6 / 2 / 0
    second = world.attempt("r2", max_records_per_run=8)
    assert list(second.ranges) == [R(0, 6, 12), R(1, 2, 4), R(2, 0, 0)]  # lags 24 / 8 / 0

    n = 2
    while world.store.committed_offsets(P) != world.source.ends():
        n += 1
        assert sum(r.size for r in world.attempt(f"r{n}", max_records_per_run=8).ranges) <= 8
    assert n == 5 and world.exactly_once_problems() == []


def test_records_lost_to_retention_fail_before_any_side_effect_or_are_skipped_and_recorded():
    world = World("xa", partitions=1)
    world.produce(0, 5)
    world.attempt("r1", max_records_per_run=2)
    world.source.delete_before((T, 0), 4)  # offsets 2 and 3 were never read

    proc = Process()
    with pytest.raises(DataLossError, match=r"t\[0\] offsets 2..3"):
        world.attempt("r2", proc)
    assert proc.engine.calls == [] and len(world.store.all_batches(P)) == 1

    summary = world.attempt("r2", skip_lost_records=True)
    assert summary.skipped == (R(0, 2, 4),) and summary.ranges == (R(0, 4, 5),)
    assert world.store.committed_offsets(P) == {(T, 0): 5}  # the CAS took over at the gap's start
    assert world.exactly_once_problems([r for r in world.source.records() if r.offset not in (2, 3)]) == []


def test_a_misconfigured_sink_fails_before_any_side_effect():
    world = World("xa")
    world.check_error = ConfigurationError("table missing")
    with pytest.raises(ConfigurationError):
        world.attempt("r1")
    assert world.store.pipelines == {}


def test_a_second_owner_or_another_mode_is_refused_without_fencing_anyone():
    world = World("upsert")
    world.attempt("r1", owner=Owner("dag_a", "task"))
    for options in ({"owner": Owner("dag_b", "task")}, {"owner": Owner("dag_a", "task"), "interval": hour(0)}):
        proc = Process()
        with pytest.raises(PipelineConflictError):
            world.attempt("r2", proc, **options)
        assert proc.engine.calls == []
    assert world.store.epoch(P) == 1 and world.store.intervals == {}


# --------------------------------------------------------------------------- interval mode


def test_interval_mode_plans_from_the_intervals_timestamps_and_commits():
    world = interval_world()
    proc = Process()
    summary = world.attempt("scheduled__0", proc, interval=hour(0))
    assert summary.interval == hour(0) and summary.mode is Mode.INTERVAL
    assert list(summary.ranges) == [R(0, 0, 3), R(1, 0, 1)] and summary.records_in == 4
    assert not (summary.resumed or summary.replayed or summary.already_committed)
    batch = world.store.batch_for_interval(P, hour(0))
    assert batch.state == COMMITTED and batch.interval == hour(0) and batch.ranges == list(summary.ranges)
    assert world.store.committed_offsets(P) == {}  # interval batches have no running position
    assert world.store.epoch(P, hour(0)) == 1 and world.store.epoch(P) == 0  # the interval's epoch moved
    assert world.exactly_once_problems(records_in(world, summary.ranges)) == []

    following = world.attempt("scheduled__1", interval=hour(1))  # adjacent intervals share their boundary
    assert list(following.ranges) == [R(0, 3, 5), R(1, 1, 3)] and following.batch_id == summary.batch_id + 1


def test_a_committed_interval_is_replayed_with_its_recorded_ranges_and_the_upsert_table_is_unchanged():
    world = interval_world()
    first = world.attempt("scheduled__0", interval=hour(0))
    world.produce(0, timestamp_ms=ms(T0 + 30 * MINUTE))  # late record inside the interval: not in its ranges
    table = dict(world.server.rows)

    replay = world.attempt("scheduled__0", interval=hour(0))  # the run cleared
    assert replay.replayed and not replay.resumed and not replay.already_committed
    assert (replay.batch_id, replay.ranges, replay.epoch) == (first.batch_id, first.ranges, 2)
    assert world.server.rows == table
    assert all(world.server.writes[rec.id] == 2 for rec in records_in(world, first.ranges))
    [batch] = world.store.all_batches(P)
    assert batch.state == COMMITTED and batch.epoch == 2 and batch.summary.replayed and batch.summary.epoch == 2


@pytest.mark.parametrize("run_id", ["scheduled__0", "backfill__0"], ids=["retry", "another-run"])
def test_an_unfinished_interval_batch_is_resumed_with_its_recorded_ranges(run_id):
    world = interval_world()
    with pytest.raises(Killed):
        world.attempt("scheduled__0", Process(kill_at=("upsert.row", 2)), interval=hour(0))
    [left] = world.store.unfinished_batches(P)
    world.produce(1, timestamp_ms=ms(T0 + 40 * MINUTE))  # late record inside the interval: not in its ranges

    summary = world.attempt(run_id, interval=hour(0))
    assert summary.resumed and summary.batch_id == left.batch_id and list(summary.ranges) == left.ranges
    assert world.store.batch_for_interval(P, hour(0)).state == COMMITTED
    assert world.exactly_once_problems(records_in(world, left.ranges)) == []


def test_an_interval_not_complete_yet_raises_before_any_side_effect():
    world = interval_world()
    proc = Process()
    with pytest.raises(IntervalNotReadyError):
        world.attempt("scheduled__2", proc, interval=hour(2))
    assert proc.engine.calls == [] and proc.sink.writes == []
    assert world.store.all_batches(P) == [] and world.server.rows == {}

    for partition in (0, 1):  # every partition moved past the interval's end: a retry plans it
        world.produce(partition, timestamp_ms=ms(T0 + 3 * HOUR))
    summary = world.attempt("scheduled__2", interval=hour(2))
    assert list(summary.ranges) == [R(0, 5, 6), R(1, 3, 4)]


def test_interval_epochs_do_not_fence_attempts_of_other_intervals():
    world = interval_world()
    other = []
    proc = Process(pause_at="store.commit_batch", on_pause=lambda: other.append(world.attempt("h1", interval=hour(1))))
    summary = world.attempt("h0", proc, interval=hour(0))
    assert other and {b.batch_id for b in world.store.committed_batches(P)} == {summary.batch_id, other[0].batch_id}


def test_interval_mode_needs_an_interval():
    store, source = FakeStore(), FakeSource({T: 1})
    proc = Process()
    with pytest.raises(ConfigurationError, match="interval mode needs"):
        run_interval_batch(RunRequest(P, "r1", [T]), store, source, FakeEngine(source, proc),
                           FakeUpsertSink(UpsertTable(), proc))
    assert store.pipelines == {}


# --------------------------------------------------------------------------- fencing


def _before_insert(world):
    return "r1", {}, lambda: world.attempt("r2")


def _before_adopt(world):
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="crash:after_plan"))
    return "r1", {}, lambda: world.attempt("r1")  # a newer retry of the same run


def _before_abort(world):
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="crash:after_plan"))
    return "r2", {}, lambda: world.attempt("r3")


def _before_replay(world):
    world.attempt("h0", interval=hour(0))
    return "h0", {"interval": hour(0)}, lambda: world.attempt("h0", interval=hour(0))


FENCED_WRITES = {
    "insert_batch": _before_insert,
    "adopt_batch": _before_adopt,
    "mark_prepared": _before_insert,
    "commit_batch": _before_insert,
    "abort_batch": _before_abort,
    "record_replay": _before_replay,
}


@pytest.mark.parametrize("method", sorted(FENCED_WRITES))
def test_a_newer_attempt_fences_the_older_one_at_every_store_write(method):
    """The older attempt pauses just before ``method``; a newer attempt takes the pipeline (the interval)
    and runs to its end; the older one continues: its write is refused, nothing of it becomes visible."""
    if method == "record_replay":
        world = interval_world()
    else:
        world = World("xa")
        world.produce(0, 3)
        world.produce(1, 2)
    run_id, options, newer_attempt = FENCED_WRITES[method](world)
    newer: list[BatchSummary] = []
    older = Process(pause_at=f"store.{method}", on_pause=lambda: newer.append(newer_attempt()))

    with pytest.raises(FencedError):
        world.attempt(run_id, older, **options)
    assert older.trace[-1] == f"store.{method}"  # refused at that very write
    [summary] = newer
    assert summary.epoch > older.epoch
    batches = world.store.all_batches(P)
    assert all(b.epoch != older.epoch for b in batches)  # no row carries the older attempt's epoch
    assert world.store.get_batch(P, summary.batch_id).state == COMMITTED
    committed = [r for b in world.store.committed_batches(P) for r in b.ranges]
    assert world.exactly_once_problems(records_in(world, committed)) == []
    if method == "record_replay":
        assert world.store.get_batch(P, summary.batch_id).summary.epoch == summary.epoch
    else:
        assert world.store.committed_offsets(P) == world.source.ends()
        assert all(Xid.decode(x).epoch != older.epoch for x in world.server.committed)


def test_a_newer_attempt_fences_the_older_one_at_the_roll_forward():
    world = World("kafka")
    world.produce(0, 3)
    with pytest.raises(Killed):
        world.attempt("r1", Process(kill_at="kafka.committed"))
    newer: list[BatchSummary] = []
    older = Process(pause_at="store.commit_batch", on_pause=lambda: newer.append(world.attempt("r3")))
    with pytest.raises(FencedError):
        world.attempt("r2", older)
    assert older.trace[-1] == "store.commit_batch" and newer
    rolled = world.store.get_batch(P, 0)
    assert rolled.state == COMMITTED and rolled.summary.rolled_forward and rolled.epoch == newer[0].epoch
    assert world.store.batch_for_run(P, "r2") is None
    assert world.exactly_once_problems() == []


def test_a_zombie_kafka_producer_is_fenced_by_the_newer_attempts_recovery():
    world = World("kafka")
    world.produce(0, 3)
    newer: list[BatchSummary] = []
    older = Process(pause_at="kafka.commit", on_pause=lambda: newer.append(world.attempt("r2")))
    with pytest.raises(ProducerFencedError):
        world.attempt("r1", older)
    assert newer and world.server.aborted == 1  # the newer producer's init_transactions aborted the older's
    assert world.exactly_once_problems() == []


def test_a_kafka_commit_of_a_zombie_between_a_newer_take_and_its_recovery_is_rolled_forward():
    """The newer attempt took the pipeline but died before its recovery fenced the older producer: the
    older one's Kafka commit goes through, its store write is fenced, the next attempt rolls it forward."""
    world = World("kafka")
    world.produce(0, 3)
    older = Process(pause_at="kafka.commit",
                    on_pause=lambda: pytest.raises(Killed, world.attempt, "r2",
                                                   Process(kill_at="store.take_pipeline:done")))
    with pytest.raises(FencedError):
        world.attempt("r1", older)
    assert "kafka.committed" in older.trace and world.store.unfinished_batches(P)[0].run_id == "r1"
    world.attempt("r3")
    assert world.store.get_batch(P, 0).summary.rolled_forward
    assert world.exactly_once_problems() == []


def test_a_zombies_branch_prepared_after_its_batch_was_committed_is_rolled_back():
    """The older attempt pauses between its two branches; its run's retry resumes the batch and commits it;
    the older one prepares its second branch (a stray of a committed batch) and dies before anything else."""
    world = World("xa")
    world.produce(0, 4)
    world.produce(1, 4)
    newer: list[BatchSummary] = []
    older = Process(pause_at=("xa.prepare", 2), on_pause=lambda: newer.append(world.attempt("r1")),
                    kill_at=("xa.prepared", 2))
    with pytest.raises(Killed):
        world.attempt("r1", older)
    [stray] = world.server.prepared
    assert newer[0].resumed and Xid.decode(stray).epoch == older.epoch and world.exactly_once_problems() != []
    world.attempt("r2")  # recovery: the batch committed, but not with this xid
    assert stray in world.server.rolled_back
    assert world.exactly_once_problems() == []


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_a_zombies_late_upsert_write_lands_unless_the_sink_is_fenced_by_the_epoch(fenced):
    """Records share keys (last write wins). The older attempt pauses before its first row; newer attempts
    commit the same keys and newer values; then the older one writes its rows (an executor that outlived
    its driver). Fenced by the store's epoch (``EpochFence``, sink on the store's server), the write is
    refused; without the fence it overwrites newer values: a sink-level limitation, not the protocol's."""
    world = World("upsert", partitions=1, keys_per_partition=2, fenced_upsert=fenced)
    world.produce(0, 2)

    def newer() -> None:
        world.attempt("r2")
        world.produce(0, 2)  # newer values of the same two keys
        world.attempt("r3")

    older = Process(pause_at="upsert.row", on_pause=newer)
    with pytest.raises(FencedError):
        world.attempt("r1", older)
    assert older.trace[-1] == ("upsert.row" if fenced else "store.commit_batch")
    assert world.store.committed_offsets(P) == {(T, 0): 4}
    if fenced:
        assert world.exactly_once_problems() == []
    else:
        assert world.server.rows == {"t-0-key0": world.source.logs[(T, 0)][0].value,  # stale
                                     "t-0-key1": world.source.logs[(T, 0)][1].value}
        assert world.exactly_once_problems() != []


def test_the_fake_store_refuses_stale_epochs_conflicting_offsets_illegal_transitions_and_duplicate_runs():
    store = FakeStore()
    epoch = store.take_pipeline(P)
    batch = store.insert_batch(P, epoch, "r1", [R(0, 0, 3)], [])
    with pytest.raises(DuplicateKeyError):
        store.insert_batch(P, epoch, "r1", [R(0, 0, 3)], [])
    with pytest.raises(FencedError):
        store.insert_batch(P, epoch - 1, "r2", [R(0, 0, 3)], [])
    store.commit_batch(batch, epoch, BatchSummary.of(batch, "r1", epoch))
    stale = store.insert_batch(P, epoch, "r2", [R(0, 0, 4)], [])
    with pytest.raises(CommitConflictError, match="committed at offset 3"):
        store.commit_batch(stale, epoch, BatchSummary.of(stale, "r2", epoch))
    committed = store.get_batch(P, batch.batch_id)
    illegal = [lambda: store.abort_batch(committed, epoch), lambda: store.mark_prepared(committed, epoch, ["x"]),
               lambda: store.adopt_batch(committed, epoch), lambda: store.commit_batch(batch, epoch, committed.summary)]
    for write in illegal:
        with pytest.raises(CommitConflictError):
            write()
    store.abort_batch(stale, epoch)
    assert store.batch_for_run(P, "r2") is None and store.unfinished_batches(P) == []
    assert store.committed_offsets(P) == {(T, 0): 3}
    with pytest.raises(FencedError):
        store.abort_batch(stale, store.take_pipeline(P) - 1)


# --------------------------------------------------------------------------- the summary


def test_the_batch_summary_round_trips_through_its_dict():
    world = interval_world()
    interval_summary = world.attempt("h0", interval=hour(0))
    continuous = World("kafka", partitions=1)
    continuous.produce(0, 4)
    continuous.attempt("r1", max_records_per_run=1)
    continuous.source.delete_before((T, 0), 3)
    skipping = continuous.attempt("r2", skip_lost_records=True)
    flagged = replace(skipping, resumed=True, replayed=True, already_committed=True, rolled_forward=True,
                      dead_letters=2, seconds={"plan": 0.25, "execute": 1.5})
    assert skipping.skipped == (R(0, 1, 3),)

    for summary in (interval_summary, skipping, flagged):
        data = json.loads(json.dumps(summary.to_dict()))  # JSON-ready (XCom, the batch row)
        assert BatchSummary.from_dict(data) == summary
        assert data["mode"] == summary.mode.value
    assert interval_summary.to_dict()["interval"] == {"start": "2026-03-01T00:00:00+00:00",
                                                      "end": "2026-03-01T01:00:00+00:00"}


# --------------------------------------------------------------------------- random interleavings


SEEDS = 300
STEPS = 30  # a random kill / failure / pause falls on one of an attempt's first STEPS steps (a batch: ~20-30)


class Scenario:
    """One random history of a continuous pipeline: records produced, attempts of new runs, retries and clears,
    killed or failing at random steps, paused while newer attempts run (zombies); then drained without faults.
    ``Scenario(kind, seed).run()`` replays a failing seed."""

    def __init__(self, kind: str, seed: int) -> None:
        self.kind, self.seed = kind, seed
        self.rng = random.Random(f"{kind}/{seed}")
        # upsert: records share keys (the last write wins), its writes are fenced by the epoch (EpochFence)
        self.world = World(kind, partitions=self.rng.randint(1, 3), keys_per_partition=3, fenced_upsert=True)
        self.cap = self.rng.choice([None, None, 3, 8])
        self.runs: list[str] = []
        self.log: list[str] = []
        self.stats: Counter[str] = Counter()

    def fail(self, message: str) -> None:
        raise AssertionError(f"{self.kind} seed {self.seed} (replay: Scenario({self.kind!r}, {self.seed}).run()): "
                             f"{message}\nhistory:\n" + "\n".join(self.log))

    def no_fail(self, step: str) -> bool:
        return False  # every step may fail (an error after the store's commit included)

    def run(self) -> Counter[str]:
        try:
            for _ in range(self.rng.randint(3, 12)):
                if self.rng.random() < 0.3:
                    self.produce(0)
                else:
                    self.attempt(0)
                self.check_safety()
            self.drain()
            self.check_final()
        except AssertionError as exc:
            if "history:" in str(exc):
                raise
            self.fail(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # an error no attempt should raise
            self.fail(f"{type(exc).__name__}: {exc}")
        self.stats["rolled_forward"] += sum(bool(b.summary and b.summary.rolled_forward)
                                            for b in self.world.store.committed_batches(P))
        return self.stats

    def produce(self, depth: int) -> None:
        n = self.rng.randint(1, 6)
        partitions = len(self.world.source.logs)
        for _ in range(n):
            self.world.produce(self.rng.randrange(partitions))
        self.log.append(f"{'  ' * depth}produce {n} -> ends {sorted(self.world.source.ends().values())}")

    def attempt(self, depth: int, zombie_of: str | None = None) -> None:
        rng, store = self.rng, self.world.store
        done = [r for r in self.runs if (b := store.batch_for_run(P, r)) is not None and b.state == COMMITTED]
        failed = [r for r in self.runs if r not in done]
        what = rng.choices(["new", "retry", "clear"], weights=[4, 4 if failed else 0, 1 if done else 0])[0]
        if zombie_of is not None:  # the scheduler gave up on a zombie and retries its task
            what, run_id = "retry", zombie_of
        elif what == "new":
            run_id = f"r{len(self.runs)}"
            self.runs.append(run_id)
        elif what == "retry":  # a run that did not commit (yet), mostly the latest, as Airflow retries a task
            run_id = failed[-1] if rng.random() < 0.7 else rng.choice(failed)
        else:  # a run that committed, cleared
            run_id = rng.choice(done)
        roll = rng.random()
        proc = Process(kill_at=rng.randint(1, STEPS) if roll < 0.45 else None,
                       fail_at=rng.randint(1, STEPS) if 0.45 <= roll < 0.65 else None, no_fail=self.no_fail)
        if depth < 2 and rng.random() < 0.3:
            proc.pause_at = rng.randint(1, STEPS)
            proc.on_pause = lambda: self.while_paused(depth + 1, run_id)
            if rng.random() < 0.3:  # the zombie dies soon after it continues
                proc.kill_at, proc.fail_at = proc.pause_at + rng.randint(0, 6), None
        indent = "  " * depth
        self.log.append(f"{indent}{what} {run_id}: kill_at={proc.kill_at} fail_at={proc.fail_at} "
                        f"pause_at={proc.pause_at if proc.on_pause else None}")
        try:
            summary = self.world.attempt(run_id, proc, max_records_per_run=self.cap)
        except Killed as exc:
            outcome = f"killed at {exc}"
            self.stats["killed"] += 1
        except InjectedError as exc:
            outcome = str(exc)
            self.stats["failed"] += 1
        except FencedError:
            if not store.epoch(P) > proc.epoch:
                self.fail(f"{run_id} fenced at epoch {proc.epoch} though the pipeline is at {store.epoch(P)}")
            outcome = "fenced"
            self.stats["fenced"] += 1
        except ProducerFencedError:
            if self.kind != "kafka" or not self.world.server.producer_epoch > proc.sink._epoch:
                self.fail(f"{run_id}: producer fenced without a newer producer")
            outcome = "producer fenced"
            self.stats["producer_fenced"] += 1
        else:
            outcome = self.check_summary(run_id, summary, proc)
        self.log.append(f"{indent}  -> {outcome}; steps: {' '.join(proc.trace)}")

    def while_paused(self, depth: int, run_id: str) -> None:
        self.log.append(f"{'  ' * depth}(paused; newer attempts run)")
        for _ in range(self.rng.randint(1, 2)):
            if self.rng.random() < 0.6:
                self.produce(depth)
            self.attempt(depth, zombie_of=run_id if self.rng.random() < 0.5 else None)

    def check_summary(self, run_id: str, summary: BatchSummary, proc: Process) -> str:
        batch = self.world.store.get_batch(P, summary.batch_id)
        if batch is None or batch.state != COMMITTED or tuple(batch.ranges) != summary.ranges:
            self.fail(f"{run_id} returned batch {summary.batch_id} which the store has as {batch}")
        if batch.run_id != run_id and not (summary.resumed or summary.already_committed):
            self.fail(f"{run_id} returned batch {batch.batch_id} of run {batch.run_id}")
        if summary.already_committed:
            self.stats["already_committed"] += 1
            if proc.engine.calls or proc.sink.writes:
                self.fail(f"{run_id}: a run that had committed wrote again")
            return f"already committed batch {summary.batch_id}"
        if batch.epoch != proc.epoch:  # e.g. a zombie resumed after its pause and "succeeded"
            self.fail(f"{run_id} (epoch {proc.epoch}) returned batch {batch.batch_id} committed by epoch {batch.epoch}")
        self.stats["resumed" if summary.resumed else "committed"] += 1
        return f"committed batch {summary.batch_id} {' '.join(map(str, summary.ranges))}"

    def check_tiling(self, final: bool) -> None:
        """Committed batches tile each partition from 0 with no gap and no overlap, up to the store's offsets."""
        store, source = self.world.store, self.world.source
        committed, offsets = store.committed_batches(P), store.committed_offsets(P)
        for tp in source.logs:
            position = 0
            for batch in committed:
                ranges = [r for r in batch.ranges if r.key == tp]
                if len(ranges) != 1 or batch.skipped or ranges[0].from_offset != position:
                    self.fail(f"batch {batch.batch_id} {batch.ranges} does not continue {tp} at {position}")
                position = ranges[0].until_offset
            if offsets.get(tp, 0) != position:
                self.fail(f"store offset of {tp} is {offsets.get(tp)}, the committed batches end at {position}")
            if final and position != source.end(tp):
                self.fail(f"{tp}: committed up to {position}, the topic ends at {source.end(tp)}")

    def check_safety(self) -> None:
        """What must hold at any time, whatever crashed."""
        store, world = self.world.store, self.world
        if len(store.unfinished_batches(P)) > 1:
            self.fail(f"several unfinished batches: {store.unfinished_batches(P)}")
        self.check_tiling(final=False)
        visible = world.visible()
        if self.kind != "upsert" and any(n > 1 for n in visible.values()):
            self.fail(f"applied more than once: {sorted(k for k, n in visible.items() if n > 1)}")
        committed = {rec.id for b in store.committed_batches(P) for rec in records_in(world, b.ranges)}
        if self.kind == "upsert":  # a row never goes back to a value older than its key's last committed one
            table, last = world.server, {}
            for rec_id in sorted(committed):
                last[table.key_of(world.source.logs[rec_id[:2]][rec_id[2]])] = rec_id
            stale = sorted(k for k, rec_id in table.sources.items() if k in last and rec_id < last[k])
            if stale:
                self.fail(f"rows older than their last committed value: {stale}")
        if self.kind == "xa" and set(visible) - committed:
            self.fail(f"visible before the commit point: {sorted(set(visible) - committed)}")
        if self.kind == "kafka":
            group = world.server.group_offsets
            if any(offset > group.get(tp, 0) for tp, offset in store.committed_offsets(P).items()):
                self.fail(f"the store is ahead of Kafka: {store.committed_offsets(P)} > {group}")
            if any(rec_id[2] >= group.get(rec_id[:2], 0) for rec_id in visible):
                self.fail("output visible beyond the group's committed offsets")

    def drain(self) -> None:
        store = self.world.store
        for i in range(500):
            summary = self.world.attempt(f"drain{i}", Process(), max_records_per_run=self.cap)
            self.log.append(f"drain{i}: committed batch {summary.batch_id} {' '.join(map(str, summary.ranges))}")
            if store.committed_offsets(P) == self.world.source.ends() and not store.unfinished_batches(P):
                return
        self.fail("not drained after 500 attempts")

    def check_final(self) -> None:
        self.check_tiling(final=True)
        problems = self.world.exactly_once_problems()
        if problems:
            self.fail("; ".join(problems))
        if self.kind == "upsert" and any(self.world.server.writes[rec.id] < 1 for rec in self.world.source.records()):
            self.fail("a record was never written")


@pytest.mark.parametrize("kind", SINK_KINDS)
def test_random_interleavings_of_crashes_zombies_and_clears_keep_exactly_once(kind, caplog):
    caplog.set_level(logging.ERROR, logger=protocol.__name__)
    stats: Counter[str] = Counter()
    for seed in range(SEEDS):
        stats += Scenario(kind, seed).run()
    # the histories did reach the interesting branches
    expected = {"killed", "failed", "fenced", "resumed", "already_committed", "committed"}
    if kind == "kafka":
        expected |= {"rolled_forward", "producer_fenced"}
    assert all(stats[k] > 0 for k in expected), stats
