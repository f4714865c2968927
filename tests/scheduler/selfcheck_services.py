"""Self-check of ``AirflowServices``: a real scheduler runs backfills (REST and CLI) and asset-scheduled DAGs.

No Kafka, no Spark: the DAGs' tasks append a line to a file. Run alone with ``-s`` to see the timings:
``.venv/bin/python -m pytest -s tests/scheduler/selfcheck_services.py`` (pytest collects a file named on its command
line). Not in ``make test``: a harness check whose every step ``test_backfills.py`` takes with real pipelines (REST
and CLI backfills, a DAG scheduled on a sink's Asset through an alias), for 60 s of the suite.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.scheduler.airflow_rest import from_iso
from tests.scheduler.airflow_services import AirflowServices

UPSTREAM = "selfcheck_upstream"
DOWNSTREAM = "selfcheck_downstream"
ALIAS_PRODUCER = "selfcheck_alias_producer"
ALIAS_CONSUMER = "selfcheck_alias_consumer"
TABLE_URI = "mysql://127.0.0.1:3306/db/tbl"
ALIASED_URI = "mysql://127.0.0.1:3306/db/aliased_tbl"

DAGS_SOURCE = """
from __future__ import annotations

from datetime import datetime, timezone

from airflow.sdk import DAG, Asset, AssetAlias, task

OUT = {out!r}
TABLE = Asset({table_uri!r})
ALIASED = Asset({aliased_uri!r})
ALIAS = AssetAlias("selfcheck_alias")


def append(name: str, line: str) -> None:
    with open(f"{{OUT}}/{{name}}.txt", "a") as out:
        out.write(line + "\\n")


with DAG({upstream!r}, schedule="@hourly", start_date=datetime.fromisoformat({start!r}), catchup=False):

    @task(outlets=[TABLE])
    def write_table(dag_run=None, logical_date=None) -> None:
        if (dag_run.conf or {{}}).get("fail"):
            raise RuntimeError("dag_run.conf asked this run to fail")
        append("upstream", f"{{dag_run.run_id}} {{logical_date.isoformat()}}")

    write_table()

with DAG({downstream!r}, schedule=[TABLE], start_date=datetime(2020, 1, 1, tzinfo=timezone.utc)):

    @task
    def read_table(dag_run=None) -> None:
        append("downstream", dag_run.run_id)

    read_table()

with DAG({alias_producer!r}, schedule=None, start_date=datetime(2020, 1, 1, tzinfo=timezone.utc)):

    @task(outlets=[ALIAS])
    def write_via_alias(outlet_events=None) -> None:
        outlet_events[ALIAS].add(Asset({aliased_uri!r}), extra={{"rows": 3}})
        append("alias_producer", "ran")

    write_via_alias()

with DAG({alias_consumer!r}, schedule=[ALIASED], start_date=datetime(2020, 1, 1, tzinfo=timezone.utc)):

    @task
    def read_aliased(dag_run=None) -> None:
        append("alias_consumer", dag_run.run_id)

    read_aliased()
"""


def wait_until(check, timeout: float, what: str, airflow: AirflowServices, dag_id: str | None = None):
    """Poll ``check()`` until truthy; fail with the deployment's diagnostics."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out: {what}\n{airflow.diagnostics(dag_id)}")
        time.sleep(0.5)
    return result


def settled(read, quiet_s: float, timeout: float, what: str, airflow: AirflowServices, dag_id: str):
    """``read()`` once it has not changed for ``quiet_s`` (several scheduler loops)."""
    deadline, last = time.monotonic() + timeout, read()
    while True:
        time.sleep(quiet_s)
        if (now := read()) == last:
            return now
        if time.monotonic() > deadline:
            pytest.fail(f"timed out: {what}\n{airflow.diagnostics(dag_id)}")
        last = now


def consumed_event_ids(airflow: AirflowServices, dag_id: str) -> set[int]:
    """Ids of the asset events consumed by the finished asset-triggered runs of ``dag_id``."""
    ids: set[int] = set()
    for run in airflow.dag_runs(dag_id, run_type="asset_triggered"):
        if run["state"] in ("success", "failed"):
            ids |= {e["id"] for e in airflow.upstream_asset_events(dag_id, run["dag_run_id"])}
    return ids


@pytest.mark.timeout(600)
def test_backfills_and_asset_scheduling_on_real_services(tmp_path: Path) -> None:
    test_started = time.monotonic()
    out = tmp_path / "out"
    out.mkdir()
    dags = tmp_path / "dags"
    dags.mkdir()
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    (dags / "selfcheck_dags.py").write_text(
        DAGS_SOURCE.format(
            out=str(out),
            table_uri=TABLE_URI,
            aliased_uri=ALIASED_URI,
            start=(hour - timedelta(hours=8)).isoformat(),
            upstream=UPSTREAM,
            downstream=DOWNSTREAM,
            alias_producer=ALIAS_PRODUCER,
            alias_consumer=ALIAS_CONSUMER,
        )
    )
    timings: dict[str, float] = {}

    with AirflowServices(dags, base_dir=tmp_path / "airflow") as airflow:
        timings.update(airflow.timings)
        began = time.monotonic()
        # Consumers first: an asset event only queues runs of DAGs that are unpaused when it is emitted.
        for dag_id in (DOWNSTREAM, ALIAS_CONSUMER, ALIAS_PRODUCER, UPSTREAM):
            airflow.wait_for_dag(dag_id, timeout=60)
            airflow.unpause(dag_id)
        timings["dags_parsed_and_unpaused_s"] = time.monotonic() - began

        # 1. Backfill three past hourly intervals through the REST API (the UI's backfill dialog).
        logical_dates = [hour - timedelta(hours=h) for h in (5, 4, 3)]
        began = time.monotonic()
        backfill = airflow.create_backfill(UPSTREAM, logical_dates[0], logical_dates[-1], max_active_runs=3)
        run_ids = [r["dag_run_id"] for r in airflow.backfill_runs(backfill)]
        assert len(run_ids) == 3
        assert airflow.wait_for_runs(UPSTREAM, run_ids, timeout=120) == dict.fromkeys(run_ids, "success")
        timings["rest_backfill_3_runs_s"] = time.monotonic() - began
        # Only one active backfill per DAG: the next one needs this one marked completed (scheduler, every 30 s).
        airflow.wait_for_backfill(backfill["id"], timeout=90)
        timings["rest_backfill_marked_complete_s"] = time.monotonic() - began
        runs = airflow.backfill_runs(backfill)
        assert sorted(from_iso(r["logical_date"]) for r in runs) == logical_dates
        assert {r["run_type"] for r in runs} == {"backfill"}
        durations = [(from_iso(r["end_date"]) - from_iso(r["start_date"])).total_seconds() for r in runs]
        timings["dag_run_duration_avg_s"] = sum(durations) / len(durations)

        # 2. Re-run the same range with the CLI, reprocessing completed runs: the same runs execute again.
        rerun_after = datetime.now(timezone.utc)
        began = time.monotonic()
        cli_backfill = airflow.cli_backfill(
            UPSTREAM, logical_dates[0], logical_dates[-1], reprocess_behavior="completed", max_active_runs=3
        )
        timings["cli_backfill_command_s"] = time.monotonic() - began
        states = airflow.wait_for_runs(UPSTREAM, run_ids, timeout=120, ended_after=rerun_after)
        timings["cli_backfill_3_reruns_s"] = time.monotonic() - began
        assert states == dict.fromkeys(run_ids, "success")
        assert [r["dag_run_id"] for r in airflow.backfill_runs(cli_backfill)] == run_ids
        backfill_lines = [
            line for line in (out / "upstream.txt").read_text().splitlines() if line.startswith("backfill__")
        ]
        assert len(backfill_lines) == 6, backfill_lines
        executions_per_date = Counter(from_iso(line.split()[1]) for line in backfill_lines)
        assert executions_per_date == dict.fromkeys(logical_dates, 2)

        # 3. Every successful upstream execution emits one event on TABLE; the downstream DAG runs on them. Events
        # of back-to-back upstream successes are batched into one downstream run, and one emitted while the
        # scheduler is creating a downstream run is only consumed by the next run (ADRQ semantics,
        # apache/airflow#54659): step 5 shows they are all consumed once the upstream succeeds again.
        def events_of_all_successes() -> list[dict] | None:
            lines = (out / "upstream.txt").read_text().splitlines()  # + the run created when unpaused
            events = airflow.asset_events(source_dag_id=UPSTREAM)
            return events if len(events) == len(lines) else None

        events = wait_until(events_of_all_successes, 60, "an event per upstream success", airflow, UPSTREAM)
        assert {e["uri"] for e in events} == {TABLE_URI}
        wait_until(lambda: consumed_event_ids(airflow, DOWNSTREAM), 60, "a downstream run", airflow, DOWNSTREAM)
        assert consumed_event_ids(airflow, DOWNSTREAM) <= {e["id"] for e in events}

        # 4. A run whose task fails emits no event and triggers nothing downstream. (A manual run with that conf:
        # a third backfill would first have to wait for the CLI one to be marked completed.)
        downstream_run_ids = {r["dag_run_id"] for r in airflow.dag_runs(DOWNSTREAM)}
        event_ids = {e["id"] for e in airflow.asset_events(source_dag_id=UPSTREAM)}
        failed_run = airflow.trigger(UPSTREAM, conf={"fail": True}, logical_date=hour - timedelta(hours=7))
        assert airflow.wait_for_runs(UPSTREAM, [failed_run["dag_run_id"]], timeout=120) == {
            failed_run["dag_run_id"]: "failed"
        }
        assert [ti["state"] for ti in airflow.task_instances(UPSTREAM, failed_run["dag_run_id"])] == ["failed"]
        assert "dag_run.conf asked this run to fail" in airflow.task_log(
            UPSTREAM, failed_run["dag_run_id"], "write_table"
        )
        time.sleep(6)  # a few scheduler loops in which a wrongly queued downstream run would be created
        assert airflow.asset_events(source_run_id=failed_run["dag_run_id"]) == []
        if {e["id"] for e in airflow.asset_events(source_dag_id=UPSTREAM)} == event_ids:  # no hourly run meanwhile
            assert {r["dag_run_id"] for r in airflow.dag_runs(DOWNSTREAM)} == downstream_run_ids

        # 5. The next upstream success triggers a downstream run, and every upstream event is consumed by then.
        began = time.monotonic()
        ok_run = airflow.trigger(UPSTREAM, logical_date=hour - timedelta(hours=6))
        assert airflow.wait_for_runs(UPSTREAM, [ok_run["dag_run_id"]], timeout=120) == {ok_run["dag_run_id"]: "success"}
        assert len(airflow.asset_events(source_run_id=ok_run["dag_run_id"])) == 1
        all_events = {e["id"] for e in airflow.asset_events(source_dag_id=UPSTREAM)}
        wait_until(
            lambda: all_events <= consumed_event_ids(airflow, DOWNSTREAM),
            60,
            "all events consumed",
            airflow,
            DOWNSTREAM,
        )
        timings["upstream_trigger_to_downstream_done_s"] = time.monotonic() - began
        downstream_runs = airflow.dag_runs(DOWNSTREAM)
        assert {r["state"] for r in downstream_runs} == {"success"}
        assert {r["run_type"] for r in downstream_runs} == {"asset_triggered"}
        assert len(downstream_runs) > len(downstream_run_ids)
        assert sorted((out / "downstream.txt").read_text().split()) == sorted(r["dag_run_id"] for r in downstream_runs)

        # 6. An asset added at run time through an AssetAlias triggers the DAG scheduled on that asset.
        began = time.monotonic()
        producer_run = airflow.trigger(ALIAS_PRODUCER)
        assert airflow.wait_for_runs(ALIAS_PRODUCER, [producer_run["dag_run_id"]], timeout=120) == {
            producer_run["dag_run_id"]: "success"
        }
        consumer_states = airflow.wait_for_runs(ALIAS_CONSUMER, count=1, timeout=120, run_type="asset_triggered")
        timings["alias_producer_to_consumer_done_s"] = time.monotonic() - began
        assert list(consumer_states.values()) == ["success"]
        (consumer_run_id,) = consumer_states
        (event,) = airflow.upstream_asset_events(ALIAS_CONSUMER, consumer_run_id)
        assert event["uri"] == ALIASED_URI
        assert event["extra"] == {"rows": 3}
        assert event["source_dag_id"] == ALIAS_PRODUCER
        assert (out / "alias_consumer.txt").read_text().split() == [consumer_run_id]

    timings["selfcheck_total_s"] = time.monotonic() - test_started
    print("\nAirflowServices timings: " + ", ".join(f"{k}={v:.1f}" for k, v in timings.items()))
