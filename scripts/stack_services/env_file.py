"""``.stack/env``: a file to ``source`` that exports the Airflow connections and settings the example DAGs use, and
the ports and folder of this stack."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

from stack_services.connect import connect_module
from stack_services.layout import KAFKA_CLUSTER_PORT, KAFKA_PORT, REPO, STACK


def stack_env(bootstrap: str, mysql: dict, postgres: dict) -> dict[str, str]:
    mysql_uri = (f"mysql://{quote(mysql['user'], safe='')}:{quote(mysql['password'], safe='')}"
                 f"@{mysql['host']}:{mysql['port']}/{quote(mysql['database'], safe='')}")
    postgres_uri = (f"postgresql://{quote(postgres['user'], safe='')}:{quote(postgres['password'], safe='')}"
                    f"@{postgres['host']}:{postgres['port']}/{quote(postgres['database'], safe='')}")
    kafka_conn = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}})
    airflow_home = STACK / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    lines = {
        "AIRFLOW_CONN_KAFKA_DEFAULT": kafka_conn,
        "AIRFLOW_CONN_MYSQL_DEFAULT": mysql_uri,
        "AIRFLOW_CONN_EO_OFFSET_STORE": mysql_uri,
        "AIRFLOW_CONN_POSTGRES_DEFAULT": postgres_uri,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "EO_KAFKA_BOOTSTRAP": bootstrap,
        # The ports the services run on: a service the fault tests kill starts again on its own port whoever
        # sources this file (not on the default, when `make up` had EO_STACK_*_PORT and the shell running the
        # tests has not).
        "EO_STACK_KAFKA_PORT": str(KAFKA_PORT),
        "EO_STACK_MYSQL_PORT": str(mysql["port"]),
        "EO_STACK_PG_PORT": str(postgres["port"]),
        # The Kafka Connect worker's REST port (`make connect`; started by the tests when they need it).
        "EO_STACK_CONNECT_PORT": str(connect_module().port()),
        # Where this stack keeps its files and its replicated Kafka's ports: a test lane's stack
        # (tests/support/lanes.py) restarts its own services, not lane 1's.
        "EO_STACK_DIR": str(STACK),
        "EO_STACK_KAFKA_CLUSTER_PORT": str(KAFKA_CLUSTER_PORT),
    }
    return lines


def write_env(lines: dict[str, str]) -> Path:
    env_file = STACK / "env"
    env_file.write_text("".join(f"export {k}={shell_quote(v)}\n" for k, v in lines.items()))
    return env_file


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"

