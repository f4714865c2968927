"""Backfills, reprocessing and asset scheduling driven by a real Airflow scheduler (LocalExecutor).

The deployment (api-server, scheduler, dag-processor; PostgreSQL metadata database) runs on
loopback (``AirflowServices``). Backfills are created through the REST API the UI's
Trigger → Backfill dialog uses, and through ``airflow backfill create``. The sinks are
compared with ground truths computed from the produced events.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_eo.hooks.offset_store import OffsetStoreHook
from examples.page_views import produce_page_views
from examples.state import our_prepared_branches
from tests.scheduler.airflow_rest import from_iso
from tests.scheduler.airflow_services import AirflowServices
from tests.support import REPO
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.operator_harness import events_table, rows
from tests.support.page_views import (
    UPSERT_PIPELINE,
    XA_PIPELINE,
    assert_exactly_once,
    batch_rows,
    hour,
    hours_truth,
    produce_hours,
    reset,
    run_dag,
)

pytestmark = pytest.mark.timeout(1500)

ASSET_DAGS = '''
from __future__ import annotations

import json
from datetime import datetime

import time
from datetime import timedelta

from airflow.sdk import (DAG, Asset, AsyncCallback, CronDataIntervalTimetable, DeadlineAlert, DeadlineReference,
                         Param, task)

from airflow_eo.operators.alerts import pipeline_deadline_missed

from airflow_eo.examples import page_views
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink

with DAG("eo_asset_upstream", schedule=None, start_date=datetime(2026, 1, 1),
         params={{"topic": Param("unset", type="string")}}):
    KafkaMicroBatchOperator(task_id="store", pipeline_id="eo_asset_upstream.{{{{ params.topic }}}}",
                            topics=["{{{{ params.topic }}}}"], schema=page_views.SCHEMA, retries=0,
                            sink=MySqlUpsertSink(table={table!r}, key_columns=["event_id"]))

SINK = Asset({uri!r})

with DAG("eo_asset_downstream", schedule=[SINK], start_date=datetime(2026, 1, 1)):

    @task
    def record(triggering_asset_events=None) -> None:
        # Keyed by the asset (and by the alias the event came through): read the asset's own events.
        extras = [event.extra for event in triggering_asset_events[SINK]]
        with open({out!r}, "a") as out:
            out.write(json.dumps(extras) + "\\n")

    record()

# The hourly example with its sink's Asset declared as the task's outlet (docs/how-to/lineage.md): a
# backfill's concurrent first batches would otherwise race in Airflow (3.3) to link the alias to the asset.
with DAG("eo_hourly_declared", schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
         start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=3,
         params={{"topic": Param("unset", type="string")}}):

    @task
    def create_table() -> None:
        page_views.ensure_tables(EoMySqlHook("mysql_default").get_connect_kwargs())

    create_table() >> KafkaMicroBatchOperator(
        task_id="store_hour", mode="interval", pipeline_id="eo_hourly_declared.{{{{ params.topic }}}}",
        topics=["{{{{ params.topic }}}}"], schema=page_views.SCHEMA, retries=3, retry_delay=timedelta(seconds=30),
        sink=MySqlUpsertSink(table="page_view_events_hourly", key_columns=["event_id"]),
        outlets=[Asset({hourly_uri!r})])

# A pipeline DAG's deadline, made to be missed: queued-at + 2 s, a first task that takes 15 s.
with DAG("eo_deadline_probe", schedule=None, start_date=datetime(2026, 1, 1),
         deadline=DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(seconds=2),
                                callback=AsyncCallback(pipeline_deadline_missed,
                                                       kwargs={{"pipeline_id": "page_view_events_upsert"}}))):

    @task
    def slow() -> None:
        time.sleep(15)

    slow()
'''


@pytest.fixture(scope="module")
def asset_setup(tmp_path_factory, mysql_kwargs) -> dict[str, Any]:
    table = events_table(mysql_kwargs)
    database = f"mysql://{mysql_kwargs['host']}:{mysql_kwargs['port']}/{mysql_kwargs['database']}"
    return {"table": table, "uri": f"{database}/{table}", "hourly_uri": f"{database}/page_view_events_hourly",
            "out": str(tmp_path_factory.mktemp("asset_out") / "downstream.jsonl")}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, asset_setup) -> Iterator[AirflowServices]:
    dags = tmp_path_factory.mktemp("dags")
    for name in ("page_view_events_upsert.py", "recover_with_approval.py"):
        (dags / name).symlink_to(REPO / "dags" / name)
    (dags / "asset_dags.py").write_text(ASSET_DAGS.format(**asset_setup))
    env = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_CONN_") or k == "AIRFLOW_EO_SPARK_MASTER"}
    # The triggerer: deadline callbacks and the approval's wait run there.
    with AirflowServices(dags, env=env, base_dir=tmp_path_factory.mktemp("airflow"), triggerer=True) as services:
        for dag_id in ("eo_asset_downstream", "eo_asset_upstream", "eo_hourly_declared",
                       "page_view_events_upsert", "eo_deadline_probe", "eo_recover_with_approval"):
            services.wait_for_dag(dag_id, timeout=120)
        yield services


def succeeded(airflow: AirflowServices, dag_id: str, run_ids: list[str], timeout: float = 900, **kw: Any) -> None:
    states = airflow.wait_for_runs(dag_id, run_ids, timeout=timeout, **kw)
    assert states == dict.fromkeys(run_ids, "success"), airflow.diagnostics(dag_id)


def interval_epochs(mysql_kwargs: dict[str, Any], pipeline: str) -> list[int]:
    return [r[0] for r in rows(mysql_kwargs, "SELECT epoch FROM eo_interval WHERE pipeline_id = %s "
                                             "ORDER BY interval_start", (pipeline,))]


def test_backfill_of_interval_mode_dag_from_rest_api_and_cli(airflow, asset_setup, bootstrap, mysql_kwargs,
                                                             topic_name):
    create_topic(bootstrap, topic_name, 3)
    events = produce_hours(bootstrap, topic_name, [120, 150, 60])  # hour 2 ends hour 1 on every partition
    dag_id, conf = "eo_hourly_declared", {"topic": topic_name}
    pipeline = f"{dag_id}.{topic_name}"
    ids = tuple(e["event_id"] for e in events)
    ours = f"SELECT * FROM page_view_events_hourly WHERE event_id IN ({', '.join(['%s'] * len(ids))}) ORDER BY 1"

    airflow.unpause(dag_id)
    # The UI's Trigger → Backfill: hours 0..1 by their logical dates (interval starts), both at once.
    backfill = airflow.create_backfill(dag_id, hour(0)[0], hour(1)[0], max_active_runs=2, dag_run_conf=conf)
    runs = airflow.backfill_runs(backfill)
    assert sorted(from_iso(r["logical_date"]) for r in runs) == [hour(h)[0] for h in (0, 1)]
    run_ids = [r["dag_run_id"] for r in runs]
    succeeded(airflow, dag_id, run_ids)
    stored = rows(mysql_kwargs, ours, ids)
    assert {r[0] for r in stored} == hours_truth(events, 0, 1)
    batches = sorted(batch_rows(mysql_kwargs, pipeline), key=lambda b: b["ranges"][0]["from_offset"])
    assert [b["state"] for b in batches] == ["committed"] * 2
    for earlier, later in zip(batches, batches[1:], strict=False):  # contiguous hours, no overlap
        assert [r["until_offset"] for r in earlier["ranges"]] == [r["from_offset"] for r in later["ranges"]]
    assert interval_epochs(mysql_kwargs, pipeline) == [1, 1]  # concurrent hours fenced nobody
    # Each run's event is on the declared Asset: its batch, not yet a replay.
    first = [e for run_id in run_ids for e in airflow.asset_events(source_run_id=run_id)]
    assert {e["uri"] for e in first} == {asset_setup["hourly_uri"]}
    assert sorted(e["extra"]["batch_id"] for e in first) == sorted(b["batch_id"] for b in batches)
    assert {(e["extra"]["replayed"], e["extra"]["already_committed"]) for e in first} == {(False, False)}

    # The same range again from the CLI, reprocessing completed runs: every hour replays, nothing changes.
    airflow.wait_for_backfill(backfill["id"], timeout=120)  # one active backfill per DAG
    rerun_after = from_iso(max(r["end_date"] for r in airflow.backfill_runs(backfill)))
    again = airflow.cli_backfill(dag_id, hour(0)[0], hour(1)[0], reprocess_behavior="completed",
                                 max_active_runs=2, dag_run_conf=conf)
    assert sorted(r["dag_run_id"] for r in airflow.backfill_runs(again)) == sorted(run_ids)
    succeeded(airflow, dag_id, run_ids, ended_after=rerun_after)
    assert rows(mysql_kwargs, ours, ids) == stored
    assert interval_epochs(mysql_kwargs, pipeline) == [2, 2]
    summaries = rows(mysql_kwargs, "SELECT summary FROM eo_batch WHERE pipeline_id = %s", (pipeline,))
    assert [json.loads(s[0])["replayed"] for s in summaries] == [True] * 2
    events = [e for run_id in run_ids for e in airflow.asset_events(source_run_id=run_id)]
    assert sorted(e["extra"]["replayed"] for e in events) == [False] * 2 + [True] * 2
    airflow.wait_for_backfill(again["id"], timeout=120)
    airflow.pause(dag_id)


def test_backfill_of_continuous_mode_dag_continues_from_committed_offsets(airflow, bootstrap, mysql_kwargs):
    """As the README says: backfill runs are ordinary batches; a reprocessed committed run writes nothing.

    Unpausing also starts scheduled runs (every 5 minutes): they and the backfill runs must queue
    behind each other (the operator's ``max_active_tis_per_dag=1``), not fence each other.
    """
    dag_id, task_id = "page_view_events_upsert", "store_page_view_events"
    reset(mysql_kwargs, UPSERT_PIPELINE)
    produce_page_views(bootstrap, 400)
    airflow.unpause(dag_id)
    start = hour(0)[0]
    backfill = airflow.create_backfill(dag_id, start, start + timedelta(minutes=5),
                                       max_active_runs=1)  # two 5-minute logical dates, both ends inclusive
    run_ids = [r["dag_run_id"] for r in airflow.backfill_runs(backfill)]
    assert len(run_ids) == 2
    succeeded(airflow, dag_id, run_ids)
    scheduled = [r["dag_run_id"] for r in airflow.dag_runs(dag_id, run_type="scheduled")]
    succeeded(airflow, dag_id, scheduled)
    truth = assert_exactly_once(mysql_kwargs, bootstrap, UPSERT_PIPELINE)
    tries = {ti["try_number"] for run_id in run_ids + scheduled for ti in airflow.task_instances(dag_id, run_id)
             if ti["task_id"] == task_id}
    assert tries == {1}, f"a batch was fenced and retried: {airflow.diagnostics(dag_id)}"
    batches = batch_rows(mysql_kwargs, UPSERT_PIPELINE)
    assert "aborted" not in {b["state"] for b in batches}  # nobody aborted anybody's batch
    backfilled = [b for b in batches if b["run_id"] in run_ids]
    assert sorted(b["run_id"] for b in backfilled) == sorted(run_ids)  # each backfill run committed its batch

    airflow.wait_for_backfill(backfill["id"], timeout=120)
    rerun_after = from_iso(max(r["end_date"] for r in airflow.backfill_runs(backfill)))
    again = airflow.create_backfill(dag_id, backfill["from_date"], backfill["to_date"],
                                    reprocess_behavior="completed", max_active_runs=1)
    succeeded(airflow, dag_id, run_ids, ended_after=rerun_after)
    # No new batch for the re-run runs: each returned its recorded summary. (A scheduled run that
    # falls due meanwhile may commit a batch of its own; the sink must stay exact regardless.)
    assert [b for b in batch_rows(mysql_kwargs, UPSERT_PIPELINE) if b["run_id"] in run_ids] == backfilled
    succeeded(airflow, dag_id, [r["dag_run_id"] for r in airflow.dag_runs(dag_id, run_type="scheduled")])
    assert assert_exactly_once(mysql_kwargs, bootstrap, UPSERT_PIPELINE) == truth
    airflow.wait_for_backfill(again["id"], timeout=120)
    airflow.pause(dag_id)


def test_downstream_dag_runs_on_the_sink_asset_after_a_commit_not_after_a_failed_batch(
        airflow, asset_setup, bootstrap, topic_name):
    produce_page_views(bootstrap, 50, topic_name)
    for dag_id in ("eo_asset_downstream", "eo_asset_upstream"):  # consumers first
        airflow.unpause(dag_id)
    out = Path(asset_setup["out"])

    good = airflow.trigger("eo_asset_upstream", conf={"topic": topic_name})
    succeeded(airflow, "eo_asset_upstream", [good["dag_run_id"]])
    events = airflow.asset_events(source_run_id=good["dag_run_id"])
    assert [e["uri"] for e in events] == [asset_setup["uri"]]
    assert events[0]["extra"]["batch_id"] == 0 and events[0]["extra"]["records_in"] == 50
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().strip()):
        assert time.monotonic() < deadline, airflow.diagnostics("eo_asset_downstream")
        time.sleep(1)
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    assert [extra["batch_id"] for extras in seen for extra in extras] == [0]

    produce_page_views(bootstrap, 5, topic_name, raw_values=[b"{not json"])
    bad = airflow.trigger("eo_asset_upstream", conf={"topic": topic_name})
    states = airflow.wait_for_runs("eo_asset_upstream", [bad["dag_run_id"]], timeout=600)
    assert states == {bad["dag_run_id"]: "failed"}
    assert "malformed" in airflow.task_log("eo_asset_upstream", bad["dag_run_id"], "store").lower()
    assert airflow.asset_events(source_run_id=bad["dag_run_id"]) == []
    time.sleep(10)  # scheduler loops in which a wrongly queued downstream run would start
    assert len(airflow.dag_runs("eo_asset_downstream")) == len(seen)
    assert len(out.read_text().splitlines()) == len(seen)


def test_a_missed_deadline_tells_where_the_pipeline_stands(airflow):
    """A ``DeadlineAlert`` with our callback, run by the real scheduler and triggerer. The run's conf names another
    pipeline than the callback's default (a DAG whose task takes ``pipeline_id`` from the conf): the alert names the
    one the run served."""
    served = f"deadline_probe_{uuid.uuid4().hex[:8]}"  # in the store (never run), whatever ran before this test
    OffsetStoreHook().get_store().take_pipeline(served)
    airflow.unpause("eo_deadline_probe")
    run_id = airflow.trigger("eo_deadline_probe", conf={"pipeline_id": served})["dag_run_id"]
    succeeded(airflow, "eo_deadline_probe", [run_id], timeout=300)
    log = airflow.log_dir / "triggerer.log"
    deadline = time.monotonic() + 60
    said = ""
    while time.monotonic() < deadline and "missed its deadline" not in said:
        said = log.read_text(errors="replace") if log.exists() else ""
        time.sleep(1)
    line = next((x for x in said.splitlines() if "missed its deadline" in x), None)
    assert line is not None, airflow.diagnostics("eo_deadline_probe")
    assert f"run {run_id} of pipeline {served} missed its deadline; no committed batch yet" in line, line
    assert "lag " in line and "could not be read" not in line
    airflow.pause("eo_deadline_probe")


def test_an_in_doubt_batch_is_recovered_after_a_human_approves_it_as_that_approver(airflow, bootstrap, mysql_kwargs):
    """The approval DAG of dags/recover_with_approval.py: dry run shown, a person approves through the REST API
    the UI's "Required actions" use, the recovery is applied and audited with the approver as the actor. The
    approver is read from Airflow's approval record: the person who triggered the run cannot approve it (here one
    user does both) until the Variable eo_recovery_allow_self_approval allows it."""
    reset(mysql_kwargs, XA_PIPELINE)
    produce_page_views(bootstrap, 200)
    killed = run_dag(XA_PIPELINE, fault="after_commit_point")  # SIGKILL after the commit point: branches in doubt
    assert killed.returncode != 0
    prepared = our_prepared_branches(mysql_kwargs, XA_PIPELINE)
    assert prepared, "the kill left no prepared branch to recover"

    dag_id = "eo_recover_with_approval"
    airflow.unpause(dag_id)

    def approved_run() -> tuple[str, str]:
        """A run of the DAG, approved once its dry run is shown: (run id, the approver's name)."""
        run_id = airflow.trigger(dag_id, conf={"pipeline_id": XA_PIPELINE, "reason": "crash after the commit point"})[
            "dag_run_id"]
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails"
        deadline, detail = time.monotonic() + 300, None
        while time.monotonic() < deadline:
            detail = airflow.api("GET", path, ok=(200, 404))
            if detail and "detail" not in detail:
                break
            time.sleep(2)
        assert detail and "detail" not in detail, airflow.diagnostics(dag_id)
        body = json.dumps(detail)
        assert "dry run" in body and "commit" in body  # the dry run's plan is what the approver reads
        assert our_prepared_branches(mysql_kwargs, XA_PIPELINE), "nothing may change before the approval"
        # Answer as a person would, after the scheduler has seen the paused worker exit: a response that raced it had
        # Airflow 3.3.2's scheduler fail the resumed task (seen in CI, where a busy scheduler took 5 s to look).
        waiting = [ti for ti in airflow.task_instances(dag_id, run_id) if ti["task_id"] == "approve"]
        assert [ti["state"] for ti in waiting] in (["awaiting_input"], ["deferred"]), waiting
        airflow.wait_for_the_executor_event(dag_id, run_id, "approve", waiting[0]["try_number"])
        answer = airflow.api("PATCH", path, {"chosen_options": ["Approve"]})
        return run_id, answer["responded_by"]["name"]

    refused, _ = approved_run()  # approved by the user who asked
    assert airflow.wait_for_runs(dag_id, [refused], timeout=300) == {refused: "failed"}, airflow.diagnostics(dag_id)
    said = airflow.diagnostics(dag_id)
    assert "asked for this recovery and cannot approve it" in said, said[-3000:]
    assert our_prepared_branches(mysql_kwargs, XA_PIPELINE) == prepared, "a refused approval changes nothing"
    assert rows(mysql_kwargs, "SELECT actor FROM eo_audit WHERE pipeline_id = %s", (XA_PIPELINE,)) == []

    airflow.api("POST", "/variables", {"key": "eo_recovery_allow_self_approval", "value": "true"})
    try:
        run_id, approver = approved_run()
        succeeded(airflow, dag_id, [run_id], timeout=300)
    finally:
        airflow.api("DELETE", "/variables/eo_recovery_allow_self_approval", ok=(200, 204, 404))
    assert our_prepared_branches(mysql_kwargs, XA_PIPELINE) == []
    audit = rows(mysql_kwargs, "SELECT actor, action, reason FROM eo_audit WHERE pipeline_id = %s", (XA_PIPELINE,))
    assert audit == [(f"airflow:{approver}", "recover", "crash after the commit point")]
    done = run_dag(XA_PIPELINE)  # the pipeline goes on, exactly once
    assert done.returncode == 0, why(done)
    assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)
    airflow.pause(dag_id)
