"""Each database room declares its driver (``airflow_eo/core/drivers.py``): ``airflow eo`` reports any declared
driver's error in one line, not a traceback, and a room whose driver is not installed leaves the provider working,
its sinks and store failing with the extra to install. No service: the store's port is one nothing listens on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["AIRFLOW_HOME"] = str(tmp_path)
    env.update(extra)
    return env


@pytest.mark.parametrize(("conn_type", "database"), [("postgres", "PostgreSQL"), ("mysql", "MySQL / MariaDB")])
def test_a_store_that_cannot_be_reached_is_one_line_not_a_traceback(tmp_path, conn_type, database):
    url = f"{conn_type}://eo:secret@127.0.0.1:{_closed_port()}/eo"
    done = subprocess.run([sys.executable, "-m", "airflow", "eo", "pipelines"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=_env(tmp_path, AIRFLOW_CONN_EO_OFFSET_STORE=url))
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    lines = [line for line in done.stderr.splitlines() if line.startswith("airflow eo pipelines:")]
    assert len(lines) == 1 and f"{database} error:" in lines[0] and "refused" in lines[0], output


MISSING_DRIVER = """
import sys
sys.modules[{module!r}] = None  # as if the driver were not installed: importing it raises ImportError

import airflow_eo.integrations  # every room imports: the provider still works
import airflow_eo.sinks
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.sink_kinds import sink_kind
from airflow_eo.core.stores import store_for

errors = []
try:
    store_for(ConnectionInfo(conn_id="eo_offset_store", conn_type={conn_type!r}, host="127.0.0.1", port=1))
except ConfigurationError as exc:
    errors.append(str(exc))
spec = airflow_eo.sinks.{sink}(conn_id="db", table="t", key_columns=["k"])
try:
    sink_kind(spec.kind).build(spec, "p", None, None)
except ConfigurationError as exc:
    errors.append(str(exc))
assert len(errors) == 2, errors
print("\\n".join(errors))
"""


@pytest.mark.parametrize(("module", "conn_type", "sink"), [("pymysql", "mysql", "MySqlUpsertSink"),
                                                            ("psycopg", "postgres", "PostgresUpsertSink")])
def test_a_room_without_its_driver_names_the_extra_to_install(tmp_path, module, conn_type, sink):
    code = textwrap.dedent(MISSING_DRIVER.format(module=module, conn_type=conn_type, sink=sink))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert f"pip install 'airflow-eo[{conn_type}]'" in line and module in line, line


def test_the_cli_and_the_hooks_import_no_database_driver():
    """Only a database's own room imports its driver (the executors' writers import it there, lazily)."""
    package = REPO / "airflow_eo"
    for path in package.rglob("*.py"):
        room = path.relative_to(package).parts[0]
        text = path.read_text()
        if room != "mysql" and room != "examples":
            assert "import pymysql" not in text and "from pymysql" not in text, path
        if room != "postgres" and room != "examples":
            assert "import psycopg" not in text and "from psycopg" not in text, path


@pytest.mark.parametrize(("kind", "given", "deprecated", "expected"), [
    ("PostgresTwoPhaseSink", "pg_other", None, "pg_other"),  # --sink-conn-id: any kind
    ("KafkaTransactionalSink", "kafka_other", None, "kafka_other"),
    ("MySqlXaSink", None, "mysql_other", "mysql_other"),  # --mysql-conn-id: a MySQL sink only
    ("PostgresTwoPhaseSink", None, "mysql_other", None),
    ("MySqlXaSink", "given", "mysql_other", "given"),  # --sink-conn-id wins
])
def test_the_sink_connection_override_goes_by_the_kinds_registered_connection_type(kind, given, deprecated,
                                                                                   expected):
    from airflow_eo.core.sink_kinds import sink_kind
    from airflow_eo.hooks.operations import AirflowConnections

    connections = AirflowConnections("store", "kafka", given, mysql_conn_id=deprecated)
    assert connections.sink_conn_override(sink_kind(kind).capabilities.connection_type) == expected


MISSING_TABLE_LIBRARY = """
import sys
sys.modules[{module!r}] = None  # as if the library were not installed: importing it raises ImportError

import airflow_eo.sinks
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.sink_kinds import sink_kind

spec = airflow_eo.sinks.{sink}
try:
    sink_kind(spec.kind).build(spec, "p", None, None)
except ConfigurationError as exc:
    print(exc)
"""


@pytest.mark.parametrize(("module", "extra", "spec"), [
    ("deltalake", "delta", "DeltaTableSink(path='/tmp/t')"),
    ("pyiceberg", "iceberg", "IcebergTableSink(table='lake.db.t', warehouse='/tmp/w')")])
def test_a_table_format_without_its_library_names_the_extra_to_install(tmp_path, module, extra, spec):
    """The table formats check the library that reads their log through the driver registry, as the databases do."""
    code = textwrap.dedent(MISSING_TABLE_LIBRARY.format(module=module, sink=spec))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pip install 'airflow-eo[{extra}]'" in done.stdout and module in done.stdout, done.stdout
