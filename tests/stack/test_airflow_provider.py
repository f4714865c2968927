"""Airflow discovers airflow_eo as a provider, with what get_provider_info lists importable."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

from airflow_eo import get_provider_info


def test_provider_is_listed_by_airflow():
    done = subprocess.run([sys.executable, "-m", "airflow", "providers", "list", "-o", "json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    start = done.stdout.index("[")
    providers = {p["package_name"]: p for p in json.loads(done.stdout[start:])}
    assert "airflow-eo" in providers


def test_every_listed_module_imports():
    info = get_provider_info()
    for kind in ("operators", "hooks", "sensors", "triggers"):
        for entry in info.get(kind, []):
            for module in entry["python-modules"]:
                importlib.import_module(module)
