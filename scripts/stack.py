"""Local stack for airflow_eo: a single-node Kafka (KRaft), a MariaDB and a PostgreSQL, on loopback.

Usage: ``python scripts/stack.py up|down|status|clean`` (``postgres up|down``: the PostgreSQL alone; ``connect``: a
Kafka Connect worker with Debezium's PostgreSQL and MariaDB connectors, scripts/stack_connect.py); for fault tests
``kill mariadb|postgres|kafka|connect`` (SIGKILL, as a crash would), ``restart mariadb|postgres|kafka`` (SIGKILL, then
start it again on the same data) and ``second-mariadb up|down`` / ``second-postgres up|down`` (another MariaDB /
PostgreSQL server on the next port, for a store and a sink on two servers); ``binlog-mariadb up|down``: a MariaDB
that writes a row-based binlog, two ports above the stack's (a change-data-capture source for Debezium's MariaDB
connector).

Everything the stack writes lives under ``.stack/`` in the repo (ignored by git), with one exception: as root, in a
repo whose folder (or a parent) is closed to other users, PostgreSQL's data and socket live in a folder of the
``postgres`` user's under /var/tmp (the server runs as that user and could not reach ``.stack``), linked from
``.stack/postgres/root`` and removed by ``clean``. Downloaded artifacts (Kafka's jars) are cached under
``~/.cache/airflow-eo`` so a second start is fast. A user who has their own Kafka, MySQL or PostgreSQL sets
``EO_KAFKA_BOOTSTRAP``, ``EO_MYSQL_HOST`` (plus ``EO_MYSQL_PORT``, ``EO_MYSQL_USER``,
``EO_MYSQL_PASSWORD``, ``EO_MYSQL_DATABASE``) or ``EO_PG_HOST`` (plus ``EO_PG_PORT``, ``EO_PG_USER``,
``EO_PG_PASSWORD``, ``EO_PG_DATABASE``) and the stack starts nothing for that part.
``up`` always (re)writes ``.stack/env``, a file to ``source`` that exports the
Airflow connections and settings the example DAGs use, migrates the Airflow
metadata database that file points to (SQLite under ``.stack/airflow``) and writes
the DAG folder into it, so ``airflow dags test`` works right after ``up``, several at once included.

The code is in the package ``scripts/stack_services`` (one module per service); this file is its command line and
the module the tests and scripts load (tests/support/stack.py, scripts/soak.py, scripts/spark_cluster.py): the names
below are their API.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# airflow_eo.core needs nothing but the standard library: usable before the venv. scripts/: stack_services.
for folder in (HERE, REPO):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
# Each load of this file is a fresh import that reads the environment again (folders and ports: a lane's stack,
# tests/support/stack.py): the package's modules of an earlier load are imported anew, not reused.
for _name in [name for name in sys.modules if name == "stack_services" or name.startswith("stack_services.")]:
    del sys.modules[_name]

from stack_services.airflow_db import airflow_dags_reserialize, airflow_db_migrate  # noqa: E402
from stack_services.cli import clean, down, main, status, up  # noqa: E402
from stack_services.connect import connect, connect_module  # noqa: E402
from stack_services.env_file import shell_quote, stack_env, write_env  # noqa: E402
from stack_services.faults import (  # noqa: E402
    PID_FILES,
    kill,
    pid_file_of,
    restart,
    start,
    wait_until_deleted_records_stay_deleted,
)
from stack_services.kafka import kafka_cluster_down, kafka_cluster_up, kafka_up, kafka_version  # noqa: E402
from stack_services.layout import (  # noqa: E402
    CACHE,
    KAFKA_CLUSTER_PORT,
    KAFKA_PORT,
    MARIADB_PORT,
    POSTGRES_HOME,
    POSTGRES_PORT,
    SECOND_MARIADB,
    SECOND_POSTGRES,
    STACK,
)
from stack_services.mariadb import (  # noqa: E402
    binlog_mariadb_down,
    binlog_mariadb_up,
    mariadb_up,
    second_mariadb_down,
    second_mariadb_up,
)
from stack_services.postgres import (  # noqa: E402
    postgres_bin_dir,
    postgres_settings,
    postgres_up,
    postgres_user,
    reaches,
    second_postgres_down,
    second_postgres_up,
)
from stack_services.processes import die, pid_alive, port_open, require, spawn, stop, wait_for  # noqa: E402

from airflow_eo.core.failpoints import running  # noqa: E402

__all__ = [
    "CACHE", "KAFKA_CLUSTER_PORT", "KAFKA_PORT", "MARIADB_PORT", "PID_FILES", "POSTGRES_HOME", "POSTGRES_PORT",
    "REPO", "SECOND_MARIADB", "SECOND_POSTGRES", "STACK", "airflow_dags_reserialize", "airflow_db_migrate",
    "binlog_mariadb_down", "binlog_mariadb_up", "clean", "connect", "connect_module", "die", "down",
    "kafka_cluster_down", "kafka_cluster_up", "kafka_up", "kafka_version", "kill", "mariadb_up", "pid_alive",
    "pid_file_of", "port_open", "postgres_bin_dir", "postgres_settings", "postgres_up", "postgres_user", "reaches",
    "require", "restart", "running", "second_mariadb_down", "second_mariadb_up", "second_postgres_down",
    "second_postgres_up", "shell_quote", "spawn", "stack_env", "start", "status", "stop", "up", "wait_for",
    "wait_until_deleted_records_stay_deleted", "write_env",
]

if __name__ == "__main__":
    main(sys.argv[1:])
