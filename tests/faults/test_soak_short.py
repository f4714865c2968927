"""The soak (``scripts/soak.py``) in a short setting, so that it cannot rot: a few thousand events, one SIGKILLed
run (its kill and retry path; the crash chains kill every step of every sink), one MariaDB, one PostgreSQL and one
broker restart during runs, then the comparison."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_loses_and_duplicates_nothing(stack, airflow_db):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "soak.py"), "--events", "3000", "--kills", "1",
                           "--db-restarts", "1", "--pg-restarts", "1", "--broker-restarts", "1", "--wave", "3000"],
                          capture_output=True, text=True, timeout=1500)
    output = f"exit {done.returncode}\n--- stdout ---\n{done.stdout[-8000:]}\n--- stderr ---\n{done.stderr[-8000:]}"
    figures = [line for line in done.stdout.splitlines() if line.startswith("soak: events=")]
    assert figures, output
    print(figures[-1])
    values = dict(re.findall(r"(\w+)=(\d+)", figures[-1]))
    assert (values["lost"], values["duplicated"], values["prepared_left"]) == ("0", "0", "0"), output
    assert int(values["kills"]) >= 1 and values["db_restarts"] == "1" and values["broker_restarts"] == "1", output
    assert values["pg_restarts"] == "1", output
    assert int(values["events"]) >= 3000 and done.returncode == 0, output  # owed kills add input
