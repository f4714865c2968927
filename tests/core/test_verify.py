"""``airflow eo verify``'s decisions (core/verify.py) over plain data: tiling, the group mirror, open branches, runs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.pipeline_status import AuditEntry
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.core.sink_kinds import KindAdapter
from airflow_eo.core.verify import (
    Check,
    TaskRun,
    audited_batches,
    audited_moves,
    check_branches,
    check_interval_tiling,
    check_mirror,
    check_runs,
    check_sink_commits,
    check_tiling,
)
from airflow_eo.core.xid import Xid, pipeline_key

COMMITTED = BatchState.COMMITTED


def batch(batch_id: int, spans: dict[int, tuple[int, int]], state: BatchState = COMMITTED, run_id: str = "",
          skipped: dict[int, tuple[int, int]] | None = None, xids: list[str] | None = None,
          interval: Interval | None = None) -> BatchRecord:
    return BatchRecord("p", batch_id, run_id or f"run-{batch_id}", 1, state,
                       [OffsetRange("t", k, a, b) for k, (a, b) in spans.items()],
                       [OffsetRange("t", k, a, b) for k, (a, b) in (skipped or {}).items()], xids or [],
                       interval=interval)


def rewind(audit_id: int, partitions: list[tuple[int, int | None, int]]) -> AuditEntry:
    return AuditEntry(audit_id, "p", None, "me", "rewind", "why", 5, {
        "partitions": [{"topic": "t", "partition": k, "old": old, "new": new} for k, old, new in partitions]})


def test_batches_that_tile_each_partition_up_to_the_committed_offset_are_fine():
    batches = [batch(0, {0: (0, 10), 1: (0, 0)}), batch(1, {0: (10, 10), 1: (0, 7)}),
               batch(2, {0: (10, 30), 1: (7, 7)}, state=BatchState.ABORTED),  # aborted: its ranges never counted
               batch(3, {0: (10, 12), 1: (7, 9)})]
    assert check_tiling(batches, {("t", 0): 12, ("t", 1): 9}, []) == []


def test_a_gap_an_overlap_and_a_committed_offset_past_the_last_batch_are_each_one_finding():
    batches = [batch(0, {0: (0, 10), 1: (0, 5)}), batch(1, {0: (12, 20), 1: (3, 8)})]
    found = check_tiling(batches, {("t", 0): 20, ("t", 1): 9}, [])
    assert [(f.check, f.subject) for f in found] == [(Check.TILING, "t[0]"), (Check.TILING, "t[1]"),
                                                      (Check.TILING, "t[1]")]
    assert found[0].message.startswith("gap: offsets 10..12") and "batch 1 starts at 12" in found[0].message
    assert found[1].message.startswith("overlap: offsets 3..5")
    assert "committed offset is 9" in found[2].message and "ended at 8" in found[2].message


def test_audited_rewinds_and_skipped_lost_records_explain_a_jump_unaudited_ones_do_not():
    batches = [batch(0, {0: (0, 10), 1: (0, 5)}),
               batch(1, {0: (4, 10), 1: (20, 25)}, skipped={1: (5, 20)}),  # rewound 10 -> 4; lost 5..20 skipped
               batch(2, {0: (10, 10), 1: (25, 25)})]
    moves = audited_moves([rewind(1, [(0, 10, 4), (1, 5, 5)])])
    assert [(m.key, m.old, m.new) for m in moves] == [(("t", 0), 10, 4)]  # unmoved partitions are no move
    # Rewound twice since the last batch (10 -> 2 -> 6): the committed offset follows the chain.
    later = audited_moves([rewind(1, [(0, 10, 4)]), rewind(2, [(0, 10, 2)]), rewind(3, [(0, 2, 6)])])
    assert check_tiling(batches, {("t", 0): 6, ("t", 1): 25}, later) == []
    # Without the audit rows, the same store is drift; and one rewind counts once.
    found = check_tiling(batches, {("t", 0): 6, ("t", 1): 25}, [])
    assert [f.message.split(":")[0] for f in found] == ["overlap", "the store's committed offset is 6 but the last "
                                                                   "batch that read the partition (2) ended at 10, and "
                                                                   "no audited rewind moved it there"]
    assert len(check_tiling([*batches, batch(3, {0: (4, 10)})], {("t", 0): 10, ("t", 1): 25}, moves)) == 1


def test_a_partition_committed_without_any_batch_needs_an_audited_rewind():
    batches = [batch(0, {0: (0, 3)})]
    assert [f.subject for f in check_tiling(batches, {("t", 0): 3, ("t", 1): 8}, [])] == ["t[1]"]
    assert check_tiling(batches, {("t", 0): 3, ("t", 1): 8}, audited_moves([rewind(1, [(1, None, 8)])])) == []


def test_interval_batches_never_overlap_and_adjacent_intervals_meet():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    hour = [Interval(t0 + timedelta(hours=h), t0 + timedelta(hours=h + 1)) for h in range(4)]
    fine = [batch(0, {0: (0, 5)}, interval=hour[0]), batch(1, {0: (5, 9)}, interval=hour[1]),
            batch(2, {0: (20, 30)}, interval=hour[3])]  # hour 2 not run yet: no gap to report
    assert check_interval_tiling(fine) == []
    drift = [*fine, batch(3, {0: (8, 12)}, interval=hour[2], state=BatchState.PLANNED),
             batch(4, {0: (10, 21)}, interval=hour[2])]
    found = check_interval_tiling(drift)
    assert [f.message.split(":")[0] for f in found] == ["gap", "overlap"]
    assert "offsets 9..10" in found[0].message and "offsets 20..21" in found[1].message


def test_the_group_must_hold_exactly_the_stores_offsets():
    committed = {("t", 0): 10, ("t", 1): 7}
    assert check_mirror("airflow_eo.p", committed, dict(committed)) == []
    found = check_mirror("airflow_eo.p", committed, {("t", 0): 4, ("t", 2): 1})
    assert [f.subject for f in found] == ["t[0]", "t[1]", "t[2]"]
    assert "has 4, the store 10: lag tools show a lag too high by 6" in found[0].message
    assert "no committed offset; the store has 7" in found[1].message
    # A Kafka sink's transactions commit the group only where a batch read records: t[1] never had any.
    assert check_mirror("airflow_eo.p", committed, {("t", 0): 10}, without_records={("t", 1)}) == []


def test_open_branches_of_batches_that_are_over_are_findings_a_running_batchs_are_not():
    key = pipeline_key("p")
    listed, stray, running, gone = Xid(key, 0, 1, 0), Xid(key, 0, 1, 1), Xid(key, 1, 2, 0), Xid(key, 7, 1, 0)
    batches = {0: batch(0, {0: (0, 5)}, xids=[listed.encode()]), 1: batch(1, {0: (5, 9)}, state=BatchState.PREPARED)}
    found = check_branches([running, gone, stray, listed], batches)
    assert {f.subject: f.message.split(";")[-1].strip() for f in found} == {
        f"branch {listed.encode()}": "its rows do not show until it is committed (the next run, or `airflow eo "
                                     "recover --apply`, will commit it)",
        f"branch {stray.encode()}": "it holds row locks until it is rolled back (the next run, or `airflow eo "
                                    "recover --apply`, will roll back it)",
        f"branch {gone.encode()}": "it holds row locks until it is rolled back (the next run, or `airflow eo "
                                   "recover --apply`, will roll back it)"}


def test_a_batch_the_kafka_sink_committed_but_the_store_did_not_is_a_finding():
    unfinished = [batch(3, {0: (5, 9)}, state=BatchState.PLANNED), batch(4, {0: (9, 9)}, state=BatchState.PLANNED)]
    assert [f.subject for f in check_sink_commits(unfinished, {3})] == ["batch 3"]


def test_successful_runs_need_their_committed_batch_and_committed_batches_their_run():
    batches = [batch(0, {0: (0, 5)}, run_id="a"), batch(1, {0: (5, 9)}, run_id="b"),
               batch(2, {0: (9, 9)}, run_id="c", state=BatchState.ABORTED), batch(3, {0: (9, 12)}, run_id="d"),
               batch(4, {0: (12, 13)}, run_id="gone"), batch(5, {0: (13, 14)}, run_id="killed")]
    runs = [TaskRun("a", "success"), TaskRun("b", "running"), TaskRun("c", "success"), TaskRun("d", "failed"),
            TaskRun("hand", "success"), TaskRun("killed", "failed"), TaskRun("q", None)]
    found = {f.subject: f.message for f in check_runs(runs, batches, audited={5})}
    assert set(found) == {"run c", "run hand", "batch 3", "batch 4"}
    assert "its batch 2 is aborted" in found["run c"] and "the store has no batch" in found["run hand"]
    assert "is failed in Airflow" in found["batch 3"] and "Airflow does not know" in found["batch 4"]


def test_interval_runs_match_their_batch_by_interval():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    hour = Interval(t0, t0 + timedelta(hours=1))
    batches = [batch(0, {0: (0, 5)}, run_id="backfill__1", interval=hour)]
    assert check_runs([TaskRun("scheduled__1", "success", hour)], batches) == []


def test_only_rewinds_and_completed_recoveries_that_rolled_forward_are_audited_actions():
    entries = [rewind(1, [(0, 10, 4)]),
               AuditEntry(2, "p", None, "me", "recover", "x", 6, {"completed": True, "batches": [
                   {"batch_id": 3, "recover": "roll forward"}, {"batch_id": 4, "recover": "abort"}]}),
               AuditEntry(3, "p", None, "me", "recover", "x", 7, {"completed": False, "batches": [
                   {"batch_id": 5, "recover": "roll forward"}]})]
    assert audited_batches(entries) == {3}
    assert [m.audit_id for m in audited_moves(entries)] == [1]


# --------------------------------------------------------------------------- PipelineOperations.verify over fakes


class _Ledger:
    """The store as verify reads it: one XA pipeline with two committed batches, the second one's branch open."""

    def __init__(self, batches: list[BatchRecord]) -> None:
        self.batches = batches

    def pipeline(self, pipeline_id):
        from airflow_eo.core.batch import Owner
        from airflow_eo.core.config import Mode, SinkRecord
        from airflow_eo.core.pipeline_status import PipelineInfo

        return PipelineInfo(pipeline_id, 3, "d.t", Mode.CONTINUOUS, None,
                            SinkRecord("MySqlXaSink", accumulating=True, target="app_pv"), Owner("d", "t"))

    def batch_history(self, pipeline_id, limit, batch_ids=None):
        from airflow_eo.core.pipeline_status import BatchInfo

        return [BatchInfo(b, None, None, None) for b in reversed(self.batches)][:limit]

    def audit_log(self, pipeline_id, limit):
        return []

    def committed_offsets(self, pipeline_id):
        return {("t", 0): 9}


class _Connections:
    def __init__(self, ledger, branches):
        self.ledger, self.branches = ledger, branches

    def store(self):
        return self.ledger

    def offset_source(self):
        raise ConnectionError("cannot reach broker-7.internal.example:9093")

    def sink(self, pipeline_id, record):
        branches = self.branches

        class XaServer(KindAdapter):
            name = "MySqlXaSink"

            def in_doubt(self, pipeline_id):
                return branches

        return XaServer()


class _Runs:
    def task_runs(self, dag_id, task_id):
        assert (dag_id, task_id) == ("d", "t")
        return [TaskRun("run-0", "success"), TaskRun("run-1", "running")]


def test_verify_reports_each_checks_findings_and_names_a_check_it_could_not_run():
    import airflow_eo.integrations  # noqa: F401 (registers the built-in sink kinds: capabilities_of answers)
    from airflow_eo.ops.service import PipelineOperations

    open_branch = Xid(pipeline_key("p"), 1, 2, 0)
    ledger = _Ledger([batch(0, {0: (0, 5)}), batch(1, {0: (5, 9)}, xids=[open_branch.encode()])])
    report = PipelineOperations(_Connections(ledger, [open_branch]), "tester", runs=_Runs()).verify("p")
    assert [str(f).split(":")[0] for f in report.findings] == ["in-doubt"]
    assert [c.split(":")[0] for c in report.checked] == ["tiling", "in-doubt", "runs"]
    [unchecked] = report.unchecked
    assert unchecked.startswith("mirror: the offsets of group airflow_eo.p could not be read")
    assert "broker-7" in unchecked
    without_airflow = PipelineOperations(_Connections(ledger, []), "tester").verify("p").to_dict()
    assert without_airflow["findings"] == [] and "runs: Airflow's metadata database is not at hand here" in \
        without_airflow["unchecked"]


# --------------------------------------------------------------------------- runs of another pipeline id (issue 44)


def test_a_run_another_pipeline_recorded_or_whose_rendered_id_names_another_is_not_this_pipelines_finding():
    """One task whose pipeline_id changed (edited, templated from the run's conf, renamed): the runs of its earlier
    ids are theirs. Before issue 44 each of them was "the task succeeded but the store has no batch of it"."""
    batches = [batch(0, {0: (0, 5)}, run_id="mine-0")]
    runs = [TaskRun("mine-0", "success"), TaskRun("old-1", "success"), TaskRun("templated-2", "success",
                                                                             pipeline_id="p_from_conf"),
            TaskRun("hand-3", "success"), TaskRun("rendered-mine-4", "success", pipeline_id="p")]
    assert {f.subject for f in check_runs(runs, batches)} == {"run old-1", "run templated-2", "run hand-3",
                                                             "run rendered-mine-4"}  # the old behaviour
    found = check_runs(runs, batches, pipeline_id="p", recorded_elsewhere={"old-1": "p_old"})
    assert {f.subject for f in found} == {"run hand-3", "run rendered-mine-4"}


def test_verify_asks_the_store_which_of_the_tasks_other_pipelines_recorded_the_runs_in_question():
    import airflow_eo.integrations  # noqa: F401 (registers the built-in sink kinds: capabilities_of answers)
    from airflow_eo.core.batch import Owner
    from airflow_eo.core.config import Mode
    from airflow_eo.core.pipeline_status import PipelineInfo
    from airflow_eo.ops.service import PipelineOperations

    class Ledger(_Ledger):
        asked: list = []

        def pipelines(self, pipeline_id=None):
            return [PipelineInfo(p, 1, "d.t" if p != "elsewhere" else "x.y", Mode.CONTINUOUS, None, None,
                                 Owner("d", "t") if p != "elsewhere" else Owner("x", "y"))
                    for p in ("p", "p_old", "elsewhere")]

        def runs_recorded(self, pipeline_ids, run_ids):
            self.asked.append((list(pipeline_ids), list(run_ids)))
            return {"old-1": "p_old"} if "p_old" in pipeline_ids else {}

    class Runs:
        def task_runs(self, dag_id, task_id):
            return [TaskRun("run-0", "success"), TaskRun("run-1", "success"), TaskRun("old-1", "success"),
                    TaskRun("conf-2", "success", pipeline_id="p_conf"), TaskRun("hand-3", "success")]

    ledger = Ledger([batch(0, {0: (0, 5)}), batch(1, {0: (5, 9)})])
    report = PipelineOperations(_Connections(ledger, []), "tester", runs=Runs()).verify("p")
    assert [f.subject for f in report.findings if f.check is Check.RUNS] == ["run hand-3"]
    assert ledger.asked == [(["p_old"], ["hand-3", "old-1"])]  # the same task's other pipelines only
