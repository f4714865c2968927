"""Where the stack keeps its files and which ports its services take, read from the environment at import.

Every default port is below the kernel's ephemeral ports (32768-60999): a JVM's bind(0) or a client socket could
hold one of those while a killed service restarts (seen with Spark Connect on 35002).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STACK = Path(os.environ.get("EO_STACK_DIR", REPO / ".stack"))
CACHE = Path(os.environ.get("EO_CACHE_DIR", Path.home() / ".cache" / "airflow-eo"))

KAFKA_PORT = int(os.environ.get("EO_STACK_KAFKA_PORT", "29092"))
KAFKA_CONTROLLER_PORT = KAFKA_PORT + 1
MARIADB_PORT = int(os.environ.get("EO_STACK_MYSQL_PORT", "23306"))
POSTGRES_PORT = int(os.environ.get("EO_STACK_PG_PORT", "25432"))
DB_NAME, DB_USER, DB_PASSWORD = "airflow_eo", "eo", "eo"

POSTGRES_HOME = STACK / "postgres"
# Second servers (store and sink on two servers, for the fault tests): the next port.
SECOND_MARIADB = STACK / "mariadb-2"
SECOND_MARIADB_PORT = MARIADB_PORT + 1
SECOND_POSTGRES = STACK / "postgres-2"
SECOND_POSTGRES_PORT = POSTGRES_PORT + 1
# A MariaDB that writes a row-based binlog: a change-data-capture source for Debezium's MariaDB connector (the
# stack's own MariaDB keeps no binlog, as the sinks' tests and the benchmark were measured without one).
BINLOG_MARIADB = STACK / "mariadb-binlog"
BINLOG_MARIADB_PORT = MARIADB_PORT + 2

# The replicated Kafka of the tests.
KAFKA_CLUSTER = STACK / "kafka-cluster"
# Below the kernel's ephemeral ports (32768+), which a client socket may hold when a node restarts.
KAFKA_CLUSTER_PORT = int(os.environ.get("EO_STACK_KAFKA_CLUSTER_PORT", "29192"))
KAFKA_CLUSTER_PORTS = {n: KAFKA_CLUSTER_PORT + 2 * (n - 1) for n in (1, 2, 3)}  # controllers one above
