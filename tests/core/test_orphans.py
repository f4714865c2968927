"""In-doubt work found without its pipeline (``airflow eo verify --all``, ``recover --orphans``): the decisions of
``airflow_eo/core/orphans.py`` and the operations over them, against in-memory fakes of our own roles (the store's
:class:`~airflow_eo.core.stores.ManagedOffsetStore` reads and audit, a database's
:class:`~airflow_eo.core.orphans.InDoubtServer`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import airflow_eo.integrations  # noqa: F401 (registers the built-in sink kinds: capabilities_of answers)
from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import OperationError
from airflow_eo.core.orphans import (
    UNKNOWN_PIPELINE,
    Orphan,
    OrphanAction,
    ScannedBranch,
    branch_age,
    decide_open_transaction,
    decide_orphan,
    oldest_age_by_database,
    overdue,
    owner_of,
    parse_duration,
    pipeline_keys,
    seen_in_both,
)
from airflow_eo.core.pipeline_status import BatchInfo, PipelineInfo
from airflow_eo.core.recovery import BranchAction
from airflow_eo.core.xid import Xid, pipeline_key
from airflow_eo.ops.orphan_recovery import ORPHANS_ACTION
from airflow_eo.ops.service import PipelineOperations

NOW = datetime.now(timezone.utc)


@pytest.fixture(autouse=True)
def _now() -> None:
    """Ages are measured against the clock when the code runs: the fakes' times are set from it at each test (set at
    import, they were minutes old by the time a test of a long session ran)."""
    global NOW
    NOW = datetime.now(timezone.utc)
XA = SinkRecord("MySqlXaSink", True, conn_id="mysql_a", target="t")
PG = SinkRecord("PostgresTwoPhaseSink", True, conn_id="pg_a", target="t")


def test_durations_are_seconds_or_a_number_with_a_unit_and_anything_else_says_what_to_give():
    assert [parse_duration(t) for t in ("600", "0", "30s", "10m", "1.5h", "2d", " 10M ")] == [
        600, 0, 30, 600, 5400, 172800, 600]
    for bad in ("ten minutes", "-5", "10w", ""):
        with pytest.raises(OperationError, match="seconds .600. or a number with a unit"):
            parse_duration(bad)


def test_a_branch_belongs_to_the_pipeline_whose_key_it_carries_also_the_short_key_of_before_issue_23():
    keys = pipeline_keys(["a", "b"])
    assert owner_of(Xid(pipeline_key("b"), 1, 1, 0), keys, ["a", "b"]) == "b"
    assert owner_of(Xid(pipeline_key("a")[:12], 1, 1, 0), keys, ["a", "b"]) == "a"
    assert owner_of(Xid(pipeline_key("gone"), 1, 1, 0), keys, ["a", "b"]) is None


def test_the_store_decides_a_known_pipelines_branch_and_an_unknown_ones_is_left_unless_asked():
    xid = Xid(pipeline_key("a"), 4, 2, 0)
    committed = BatchRecord("a", 4, "r", 2, BatchState.COMMITTED, [], xids=[xid.encode()])
    prepared = BatchRecord("a", 4, "r", 2, BatchState.PREPARED, [], xids=[xid.encode()])
    assert decide_orphan(xid, "a", committed)[0] is OrphanAction.COMMIT
    assert decide_orphan(xid, "a", prepared)[0] is OrphanAction.ROLLBACK
    assert decide_orphan(xid, "a", None)[0] is OrphanAction.ROLLBACK
    action, why = decide_orphan(xid, None, None)
    assert action is OrphanAction.LEAVE and "--unknown rollback" in why
    assert decide_orphan(xid, None, None, unknown_rollback=True)[0] is OrphanAction.ROLLBACK


def test_age_is_the_databases_else_the_batch_rows_and_the_threshold_and_gauge_follow_it():
    prepared_at = NOW - timedelta(minutes=30)
    assert branch_age(prepared_at, 2, 2, None, NOW, NOW) == pytest.approx(1800)
    # XA RECOVER says nothing: the batch row, last written by the attempt of the branch's epoch, else planned
    assert branch_age(None, 2, 2, NOW - timedelta(hours=1), NOW - timedelta(minutes=5), NOW) == pytest.approx(300)
    assert branch_age(None, 2, 3, NOW - timedelta(hours=1), NOW - timedelta(minutes=5), NOW) == pytest.approx(3600)
    assert branch_age(None, 2, None, None, None, NOW) is None

    def orphan(database: str, age: float | None) -> Orphan:
        return Orphan(database, "b", Xid(pipeline_key("a"), 1, 1, 0), "a", age, None, OrphanAction.ROLLBACK, "")

    young, old, unknown = orphan("x", 60), orphan("x", 900), orphan("y", None)
    assert overdue([young, old, unknown], 600) == [old, unknown]  # nobody can say an unknown age is young
    assert overdue([young], 0) == [young]
    assert oldest_age_by_database([young, old, unknown], ["x", "y", "z"]) == {"x": 900, "y": 0, "z": 0}
    assert seen_in_both([1, 2, 3], [2, 3, 4]) == {2, 3}


# --------------------------------------------------------------------------- the operations, on fakes


class FakeLedger:
    """The store's reads and audit as the operations use them; ``on_take`` runs when an epoch is taken (what a
    running attempt did meanwhile)."""

    def __init__(self, pipelines: dict[str, SinkRecord], batches: list[BatchRecord]) -> None:
        self.infos = {p: PipelineInfo(p, 1, None, Mode.CONTINUOUS, NOW, sink) for p, sink in pipelines.items()}
        self.batches = {(b.pipeline_id, b.batch_id): b for b in batches}
        self.audit: list[dict[str, Any]] = []
        self.on_take: Any = None

    def pipelines(self, pipeline_id: str | None = None) -> list[PipelineInfo]:
        return list(self.infos.values())

    def batch_history(self, pipeline_id: str, limit: int, batch_ids: list[int] | None = None) -> list[BatchInfo]:
        found = [b for (p, i), b in self.batches.items() if p == pipeline_id and (batch_ids is None or i in batch_ids)]
        return [BatchInfo(b, NOW - timedelta(hours=2), NOW - timedelta(hours=1), None) for b in found][:limit]

    def unfinished_batches(self, pipeline_id: str) -> list[BatchRecord]:
        return [b for (p, _), b in self.batches.items() if p == pipeline_id and b.state in (BatchState.PLANNED,
                                                                                              BatchState.PREPARED)]

    def take_audited(self, pipeline_id: str, actor: str, action: str, reason: str, details: dict[str, Any]) -> int:
        info = self.infos[pipeline_id]
        self.infos[pipeline_id] = PipelineInfo(pipeline_id, info.epoch + 1, None, info.mode, NOW, info.sink)
        self.audit.append({"pipeline_id": pipeline_id, "epoch": info.epoch + 1, "action": action, "reason": reason,
                           "details": details})
        if self.on_take is not None:
            self.on_take(pipeline_id)
        return info.epoch + 1

    def complete_audit(self, pipeline_id: str, epoch: int, action: str, details: dict[str, Any]) -> None:
        row = next(a for a in self.audit if (a["pipeline_id"], a["epoch"], a["action"]) == (pipeline_id, epoch, action))
        row["details"] = details

    def record_audit(self, pipeline_id: str, actor: str, action: str, reason: str, details: dict[str, Any]) -> None:
        self.audit.append({"pipeline_id": pipeline_id, "epoch": None, "action": action, "reason": reason,
                           "details": details})


class FakeServer:
    """A database's prepared branches (every pipeline's); ``scans`` replaces what the next scans list."""

    def __init__(self, name: str, branches: list[ScannedBranch]) -> None:
        self.name, self.branches = name, list(branches)
        self.scans: list[list[ScannedBranch]] = []
        self.ended: list[tuple[str, BranchAction]] = []

    def in_doubt_server(self) -> str:
        return self.name

    def in_doubt_branch_name(self) -> str:
        return "prepared XA branch"

    def scan_in_doubt(self) -> list[ScannedBranch]:
        return list(self.scans.pop(0)) if self.scans else list(self.branches)

    def end_branch(self, xid: Xid, action: BranchAction) -> bool:
        known = [b for b in self.branches if b.xid == xid]
        self.branches = [b for b in self.branches if b.xid != xid]
        self.ended.append((xid.encode(), action))
        return bool(known)


class FakeConnections:
    def __init__(self, ledger: FakeLedger, servers: dict[str, Any]) -> None:
        self.ledger, self.servers = ledger, servers

    def store(self) -> FakeLedger:
        return self.ledger

    def offset_source(self) -> Any:
        raise AssertionError("in-doubt work needs no Kafka")

    def sink(self, pipeline_id: str, record: SinkRecord) -> Any:
        return self.servers[record.conn_id or ""]


def world() -> tuple[FakeLedger, FakeServer, FakeServer, dict[str, Xid]]:
    """Pipeline a (XA, batch 5 prepared and never committed), b (XA, batch 7 committed but not XA-committed),
    c (two-phase on PostgreSQL, batch 2 planned), and a branch of a pipeline no store row knows."""
    x = {"a": Xid(pipeline_key("a"), 5, 3, 0), "b": Xid(pipeline_key("b"), 7, 2, 1),
         "c": Xid(pipeline_key("c"), 2, 1, 0), "gone": Xid(pipeline_key("gone"), 9, 4, 0)}
    ledger = FakeLedger({"a": XA, "b": XA, "c": PG}, [
        BatchRecord("a", 5, "r5", 3, BatchState.PREPARED, [], xids=[x["a"].encode()]),
        BatchRecord("b", 7, "r7", 2, BatchState.COMMITTED, [], xids=[x["b"].encode()])])
    mysql = FakeServer("MySQL h:1", [ScannedBranch(x["a"]), ScannedBranch(x["b"]), ScannedBranch(x["gone"])])
    postgres = FakeServer("PostgreSQL h:2/db", [ScannedBranch(x["c"], NOW - timedelta(minutes=20), ("public.t X",))])
    return ledger, mysql, postgres, x


def operations(ledger: FakeLedger, mysql: FakeServer, postgres: FakeServer) -> PipelineOperations:
    return PipelineOperations(FakeConnections(ledger, {"mysql_a": mysql, "pg_a": postgres}), "tester")


def test_verify_all_lists_every_database_s_branches_with_pipeline_batch_age_locks_and_the_store_s_decision():
    ledger, mysql, postgres, x = world()
    report = operations(ledger, mysql, postgres).in_doubt_everywhere()
    found = {o.xid: o for o in report.orphans}
    assert report.databases == ["MySQL h:1", "PostgreSQL h:2/db"] and report.unchecked == []
    assert (found[x["a"]].pipeline, found[x["a"]].action) == ("a", OrphanAction.ROLLBACK)
    assert found[x["a"]].age_seconds == pytest.approx(3600, abs=5)  # the batch row of the branch's epoch
    assert (found[x["b"]].pipeline, found[x["b"]].action) == ("b", OrphanAction.COMMIT)
    assert (found[x["c"]].pipeline, found[x["c"]].locks) == ("c", ("public.t X",))
    assert found[x["c"]].age_seconds == pytest.approx(1200, abs=5)  # PostgreSQL's own time
    assert (found[x["gone"]].pipeline, found[x["gone"]].action) == (UNKNOWN_PIPELINE, OrphanAction.LEAVE)
    assert found[x["gone"]].age_seconds is None
    assert report.oldest_age_seconds() == {"MySQL h:1": pytest.approx(3600, abs=5),
                                           "PostgreSQL h:2/db": pytest.approx(1200, abs=5)}
    assert mysql.ended == [] and postgres.ended == [] and ledger.audit == []  # read-only


def test_recover_orphans_is_a_dry_run_unless_applied_with_a_reason():
    ledger, mysql, postgres, _ = world()
    ops = operations(ledger, mysql, postgres)
    report = ops.recover_orphans(older_than_s=0, scan_interval_s=0)
    assert report.dry_run and {o.outcome for o in report.outcomes} == {"would rollback", "would commit", "left"}
    assert mysql.ended == [] and postgres.ended == [] and ledger.audit == []
    with pytest.raises(OperationError, match="--reason"):
        ops.recover_orphans(apply=True, reason=" ", older_than_s=0, scan_interval_s=0)


def test_recover_orphans_acts_under_each_pipelines_fence_audited_and_leaves_an_unknown_pipelines_branch():
    ledger, mysql, postgres, x = world()
    report = operations(ledger, mysql, postgres).recover_orphans(apply=True, reason="DAG deleted", older_than_s=0,
                                                                 scan_interval_s=0)
    outcome = {o.orphan.xid: o for o in report.outcomes}
    assert outcome[x["a"]].outcome == "rolled back" and outcome[x["b"]].outcome == "committed"
    assert outcome[x["c"]].outcome == "rolled back" and outcome[x["gone"]].outcome == "left"
    assert outcome[x["a"]].epoch == 2  # the epoch taken for it
    assert sorted(mysql.ended) == sorted([(x["a"].encode(), BranchAction.ROLLBACK),
                                          (x["b"].encode(), BranchAction.COMMIT)])
    assert [b.xid for b in mysql.branches] == [x["gone"]]
    assert {(a["pipeline_id"], a["action"], a["reason"], a["details"]["completed"]) for a in ledger.audit} == {
        (p, ORPHANS_ACTION, "DAG deleted", True) for p in "abc"}


def test_an_unknown_pipelines_branch_is_rolled_back_only_when_asked_and_is_on_record_under_its_key():
    ledger, mysql, postgres, x = world()
    operations(ledger, mysql, postgres).recover_orphans(apply=True, reason="r", unknown_rollback=True,
                                                        older_than_s=0, scan_interval_s=0)
    assert (x["gone"].encode(), BranchAction.ROLLBACK) in mysql.ended
    assert any(a["pipeline_id"] == f"eo:{x['gone'].pipeline_key}" for a in ledger.audit)


def test_a_branch_one_scan_missed_or_younger_than_the_threshold_is_not_touched():
    ledger, mysql, postgres, x = world()
    mysql.scans = [[ScannedBranch(x["b"])]]  # the first scan: a's and the unknown branch were not prepared yet
    report = operations(ledger, mysql, postgres).recover_orphans(apply=True, reason="r", unknown_rollback=True,
                                                                 older_than_s=1800, scan_interval_s=0)
    outcome = {o.orphan.xid: o.outcome for o in report.outcomes}
    assert outcome[x["a"]].startswith("skipped: listed by one scan")
    assert outcome[x["gone"]].startswith("skipped: listed by one scan")
    assert outcome[x["c"]] == "skipped: not older than 1800s"  # 20 minutes old
    assert outcome[x["b"]] == "committed"  # an hour old, listed twice
    assert mysql.ended == [(x["b"].encode(), BranchAction.COMMIT)] and postgres.ended == []


def test_the_decision_is_taken_on_the_batch_row_read_after_the_fence():
    """Between the scans and the take, a's attempt reached its commit point: its branch is committed, not rolled back
    as the scan's reading said (no attempt of an earlier epoch can commit after the take)."""
    ledger, mysql, postgres, x = world()

    def attempt_committed(pipeline_id: str) -> None:
        if pipeline_id == "a":
            ledger.batches[("a", 5)] = BatchRecord("a", 5, "r5", 3, BatchState.COMMITTED, [], xids=[x["a"].encode()])

    ledger.on_take = attempt_committed
    report = operations(ledger, mysql, postgres).recover_orphans(apply=True, reason="r", older_than_s=0,
                                                                 scan_interval_s=0)
    assert {o.orphan.xid: o.outcome for o in report.outcomes}[x["a"]] == "committed"
    assert (x["a"].encode(), BranchAction.COMMIT) in mysql.ended


def test_a_database_that_cannot_be_reached_is_named_and_the_others_are_still_scanned():
    ledger, mysql, postgres, x = world()

    def down() -> list[ScannedBranch]:
        raise ConnectionError("connection refused")

    postgres.scan_in_doubt = down  # type: ignore[method-assign]
    report = operations(ledger, mysql, postgres).in_doubt_everywhere()
    assert report.databases == ["MySQL h:1"]
    assert len(report.unchecked) == 1 and "PostgreSQL h:2/db" in report.unchecked[0]
    assert "connection refused" in report.unchecked[0]
    assert {o.xid for o in report.orphans} == {x["a"], x["b"], x["gone"]}


# --------------------------------------------------------------------------- Kafka-sink pipelines' open transactions

KAFKA = SinkRecord("KafkaTransactionalSink", True, conn_id="kafka_out", target="out")


class FakeKafka:
    """A Kafka sink's output topic with a transaction left open on partition 1."""

    def __init__(self, committed: set[int]) -> None:
        self.committed = committed

    def in_doubt_server(self) -> str:
        return "Kafka b:9092"

    def transactional_id(self) -> str:
        return "airflow_eo.k"

    def open_transactions(self) -> dict[tuple[str, int], tuple[int, int]]:
        return {("out", 1): (40, 57)}

    def committed_batches(self, unfinished: list[BatchRecord]) -> set[int]:
        return {b.batch_id for b in unfinished} & self.committed


def test_an_open_transaction_is_the_unfinished_batchs_aborted_unless_kafka_committed_it():
    planned = BatchRecord("k", 8, "r8", 4, BatchState.PLANNED, [])
    assert decide_open_transaction([planned], set())[:2] == (8, "abort")
    assert decide_open_transaction([planned], {8})[:2] == (8, "roll forward")
    batch_id, action, why = decide_open_transaction([], set())
    assert (batch_id, action) == (None, "abort") and "Kafka aborts it after its timeout" in why


def test_verify_all_lists_a_kafka_sink_pipelines_open_transaction_with_what_readers_wait_on():
    ledger, mysql, postgres, _ = world()
    ledger.infos["k"] = PipelineInfo("k", 4, None, Mode.CONTINUOUS, NOW, KAFKA)
    ledger.batches[("k", 8)] = BatchRecord("k", 8, "r8", 4, BatchState.PLANNED, [])
    servers = {"mysql_a": mysql, "pg_a": postgres, "kafka_out": FakeKafka(set())}
    ops = PipelineOperations(FakeConnections(ledger, servers), "tester")
    report = ops.in_doubt_everywhere()
    [open_one] = report.transactions
    assert (open_one.pipeline, open_one.batch_id, open_one.action) == ("k", 8, "abort")
    assert open_one.to_dict()["locks"] == ["read_committed readers of out[1] stop at offset 40 (end 57)"]
    assert open_one.age_seconds == pytest.approx(3600, abs=5)
    assert "Kafka b:9092" in report.databases and report.oldest_age_seconds()["Kafka b:9092"] > 0
    assert open_one.key in report.to_dict(0)["overdue"]
    dry = ops.recover_orphans(older_than_s=0, scan_interval_s=0)
    assert [o.outcome for o in dry.outcomes if o.orphan.pipeline == "k"] == ["would recover k (abort)"]
    assert ledger.audit == []


def test_a_branch_on_another_database_than_its_pipelines_sink_is_left():
    """A pipeline of the same id in another store may write there: this store's batch rows do not decide it."""
    ledger, mysql, postgres, x = world()
    stray = Xid(pipeline_key("c"), 2, 1, 1)  # pipeline c writes to PostgreSQL; this one is on the MariaDB server
    mysql.branches.append(ScannedBranch(stray))
    ops = operations(ledger, mysql, postgres)
    found = {o.xid: o for o in ops.in_doubt_everywhere().orphans}
    assert found[stray].pipeline == "c" and found[stray].action is OrphanAction.LEAVE
    assert "writes to PostgreSQL h:2/db, not here" in found[stray].reason
    report = ops.recover_orphans(apply=True, reason="r", older_than_s=0, scan_interval_s=0)
    assert {o.orphan.xid: o.outcome for o in report.outcomes}[stray] == "left"
    assert stray not in [Xid.decode(e) for e, _ in mysql.ended]
