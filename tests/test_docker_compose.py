"""Static checks of docker-compose.yaml.

`docker compose config` parses, interpolates and validates the file without a
Docker engine, so this runs wherever the compose client is installed; what it
exposes (ports, logins, secrets) is checked from the YAML itself, everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"

EXPECTED_SERVICES = {
    "kafka",
    "mysql",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
CONN_VARS = (
    "AIRFLOW_CONN_KAFKA_DEFAULT",
    "AIRFLOW_CONN_MYSQL_DEFAULT",
    "AIRFLOW_CONN_EO_OFFSET_STORE",
    "AIRFLOW_CONN_POSTGRES_DEFAULT",
)


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "AIRFLOW__API_AUTH__JWT_SECRET": "test-only-secret"},  # required: no default
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def compose_client() -> None:
    if shutil.which("docker") is None:
        pytest.skip("docker compose client not installed: no `docker` on PATH")
    version = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, timeout=60
    )
    if version.returncode != 0:
        reason = (version.stderr or version.stdout).strip()
        pytest.skip(f"docker compose client not installed: {reason}")


def test_compose_file_is_valid(compose_client: None) -> None:
    result = _compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_compose_services_and_connections(compose_client: None) -> None:
    result = _compose("config", "--format", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]

    missing = EXPECTED_SERVICES - services.keys()
    assert not missing, f"services missing from docker-compose.yaml: {sorted(missing)}"

    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["mysql"]["image"] == "mysql:8.4"

    scheduler_env = services["airflow-scheduler"].get("environment") or {}
    for name in CONN_VARS:
        assert scheduler_env.get(name), f"{name} is not set on airflow-scheduler"
        # The connection URIs are JSON documents; a typo would only show at task run time.
        assert json.loads(scheduler_env[name])["conn_type"] in ("kafka", "mysql", "postgres")
    # Two-phase commit on PostgreSQL needs prepared transactions (the server's default is 0).
    assert "max_prepared_transactions=100" in services["postgres"]["command"]


def test_nothing_is_published_beyond_this_machine_and_no_login_or_secret_is_built_in() -> None:
    """Fixed database passwords are fine on loopback only; a JWT secret written in the file would let anyone
    who reads it sign tokens; everyone logged in as admin is an opt-in."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    published = {name: service.get("ports", []) for name, service in compose["services"].items()}
    assert any(published.values())
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    env = compose["x-airflow-common"]["environment"]
    jwt = env["AIRFLOW__API_AUTH__JWT_SECRET"]
    assert jwt.startswith("${AIRFLOW__API_AUTH__JWT_SECRET:?"), f"the JWT secret has a default: {jwt}"
    admins = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"
    assert env[admins] == f"${{{admins}:-False}}", f"everyone is admin by default: {env[admins]}"
