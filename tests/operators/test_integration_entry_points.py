"""Integrations are found through the entry-point group ``airflow_eo.integrations``: this package's rooms are named
there (``pyproject.toml``), and a distribution installed beside it adds a database without an edit to this package.

The distribution here is a folder on ``sys.path`` with its ``.dist-info`` (what pip installs): a room that registers
the toy SQL database of the recipe test (``tests/support/toy_database.py``). Each check runs in a fresh Python, as
the entry points are read once, when ``airflow_eo.sinks`` is first imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support import REPO

PROBE = textwrap.dedent("""
    import json
    import airflow_eo.sinks  # imports airflow_eo.integrations, which loads the group
    from airflow_eo import integrations
    from airflow_eo.core.errors import ConfigurationError
    from airflow_eo.core.sink_kinds import sink_kind
    try:
        toy = sink_kind("ToyUpsertSink").name
    except ConfigurationError as exc:
        toy = str(exc)
    print(json.dumps({"loaded": integrations.LOADED, "toy": toy, "mysql": sink_kind("MySqlUpsertSink").name}))
""")


def toy_distribution(folder: Path) -> Path:
    """``toy-eo-room`` 0.1 as pip would install it: its package and its dist-info naming the room."""
    (folder / "toy_eo_room").mkdir(parents=True)
    (folder / "toy_eo_room" / "__init__.py").write_text(
        '"""A database room of another distribution: the toy SQL database."""\n'
        "from tests.support import toy_database\n\ntoy_database.register()\n")
    info = folder / "toy_eo_room-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-eo-room\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[airflow_eo.integrations]\ntoy = toy_eo_room\n")
    (info / "RECORD").write_text("")
    return folder


def probe(*path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_this_packages_rooms_are_the_groups_and_integrations_py_names_none():
    found = probe()
    assert found["loaded"] == {"delta": "airflow_eo.delta", "iceberg": "airflow_eo.iceberg",
                               "kafka": "airflow_eo.kafka", "mysql": "airflow_eo.mysql",
                               "postgres": "airflow_eo.postgres"}
    assert found["mysql"] == "MySqlUpsertSink"
    assert "is not one airflow_eo can rebuild" in found["toy"]  # no such room installed
    assert "import airflow_eo." not in (REPO / "airflow_eo" / "integrations.py").read_text()


def test_an_installed_distribution_adds_a_database(tmp_path):
    found = probe(toy_distribution(tmp_path / "site"))
    assert found["loaded"]["toy"] == "toy_eo_room"
    assert found["toy"] == "ToyUpsertSink" and found["mysql"] == "MySqlUpsertSink"


def test_a_room_of_another_distribution_that_fails_to_import_is_left_out_and_the_rest_run(tmp_path):
    site = toy_distribution(tmp_path / "site")
    (site / "toy_eo_room" / "__init__.py").write_text("import no_such_driver_module\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "toy" not in found["loaded"] and found["mysql"] == "MySqlUpsertSink"
    assert "integration 'toy' (toy_eo_room) could not be imported" in done.stderr
