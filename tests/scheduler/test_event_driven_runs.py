"""Runs when data arrives, under a real scheduler and triggerer: ``scripts/latency.py --short --faults`` (so that it
cannot rot) deploys Airflow with the example DAG ``page_view_events_on_arrival`` on a fresh topic, produces records,
and nothing but the DAG's ``EoBacklogTrigger`` starts runs. Records produced → one asset-triggered run commits them;
no run while nothing new arrives; every event in the sink once; the DAG's two watchers of its backlog share one poll
in the triggerer. Then the triggerer is SIGKILLed while its watcher
waits and started again → one run commits that backlog; the offset store stops answering the deployment while
records arrive → no event, then one run once it answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.timeout(1500)


def test_records_start_runs_that_commit_them_once_and_nothing_else_starts_one(tmp_path: Path):
    out = tmp_path / "latency.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "latency.py"), "--short", "--faults",
                           "--json", str(out), "--keep", str(tmp_path / "deployment")],
                          capture_output=True, text=True, timeout=1400)
    output = f"exit {done.returncode}\n--- stdout ---\n{done.stdout[-8000:]}\n--- stderr ---\n{done.stderr[-8000:]}"
    assert out.exists(), output
    figures = json.loads(out.read_text())
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith("latency")))
    assert figures["warmup_runs"] == 1, output  # the first records: exactly one run, which committed them
    assert figures["run_types"] == ["asset_triggered"] and figures["failed_runs"] == [], output
    assert figures["records"] == 2 * 200 and figures["missing_in_sink"] == 0, output  # every event, once (upsert key)
    assert figures["runs_in_quiet_period"] == 0, output  # nothing new: no run
    assert figures["runs"] <= 1 + 2 and all(n >= 1 for n in figures["events_per_run"]), output
    assert figures["latency_s"]["p50"] > 0, output
    restart, away = figures["faults"]["triggerer_restart"], figures["faults"]["store_away"]
    assert restart["runs"] == 1 and restart["missing_in_sink"] == 0, output  # the watcher came back, fired once
    assert away["runs_while_away"] == 0 and away["triggerer_warned"], output  # no event while the store is away
    assert away["runs"] == 1 and away["missing_in_sink"] == 0, output  # one, once it answers
    faults = figures["faults"]
    assert faults["polls_for_two_watchers"] == 1 == faults["polls_after_the_restart"], output  # one poll for both
    assert faults["failed_runs"] == [] and figures["ok"] and done.returncode == 0, output
