"""The commands of ``scripts/stack.py``: ``up``, ``down``, ``status``, ``clean``, ``connect`` and those of the
fault tests (see its docstring)."""

from __future__ import annotations

import shutil
import signal

from stack_services.airflow_db import airflow_dags_reserialize, airflow_db_migrate
from stack_services.class_archive import spark_class_archive
from stack_services.connect import connect, connect_down, connect_kill
from stack_services.env_file import stack_env, write_env
from stack_services.faults import kill, restart
from stack_services.kafka import kafka_cluster_down, kafka_cluster_up, kafka_up
from stack_services.layout import BINLOG_MARIADB, POSTGRES_HOME, SECOND_MARIADB, SECOND_POSTGRES, STACK
from stack_services.mariadb import (
    binlog_mariadb_down,
    binlog_mariadb_up,
    mariadb_up,
    second_mariadb_down,
    second_mariadb_up,
)
from stack_services.postgres import postgres_roots, postgres_up, second_postgres_down, second_postgres_up
from stack_services.processes import die, pid_alive, stop


def up() -> None:
    STACK.mkdir(parents=True, exist_ok=True)
    bootstrap = kafka_up()
    mysql = mariadb_up()
    postgres = postgres_up()
    lines = stack_env(bootstrap, mysql, postgres)
    env_file = write_env(lines)
    airflow_db_migrate(lines)
    airflow_dags_reserialize(lines)
    spark_class_archive()
    print(f"stack: up; connections in {env_file} (source it)")


def down() -> None:
    # The worker before the broker: stopped after it, it would wait for the gone broker to commit its offsets.
    connect_down()
    kafka_cluster_down()
    stop("Kafka", STACK / "kafka" / "kafka.pid")
    stop("MariaDB", STACK / "mariadb" / "mariadb.pid")
    stop("second MariaDB", SECOND_MARIADB / "mariadb.pid")
    binlog_mariadb_down()
    # SIGINT: PostgreSQL's fast shutdown (SIGTERM waits for every client to disconnect).
    stop("PostgreSQL", POSTGRES_HOME / "postgres.pid", signal.SIGINT)
    stop("second PostgreSQL", SECOND_POSTGRES / "postgres.pid", signal.SIGINT)


def clean() -> None:
    """``down``, then remove ``.stack`` and the folders outside it that the stack's PostgreSQL kept its data in."""
    down()
    for root in postgres_roots():
        shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(STACK, ignore_errors=True)
    print(f"stack: removed {STACK}")


def status() -> None:
    for name, pid_file in (("Kafka", STACK / "kafka" / "kafka.pid"),
                           ("Kafka Connect", STACK / "connect" / "connect.pid"),
                           ("MariaDB", STACK / "mariadb" / "mariadb.pid"),
                           ("PostgreSQL", POSTGRES_HOME / "postgres.pid"),
                           ("second MariaDB", SECOND_MARIADB / "mariadb.pid"),
                           ("binlog MariaDB", BINLOG_MARIADB / "mariadb.pid"),
                           ("second PostgreSQL", SECOND_POSTGRES / "postgres.pid")):
        pid = pid_alive(pid_file)
        print(f"{name}: {f'running (pid {pid})' if pid else 'stopped'}")


def main(args: list[str]) -> None:
    commands = {"up": up, "down": down, "status": status, "clean": clean, "connect": connect}
    services = ("mariadb", "postgres", "kafka")
    if len(args) == 1 and args[0] in commands:
        commands[args[0]]()
    elif len(args) == 2 and args[0] in ("kill", "restart") and args[1] in services:
        (kill if args[0] == "kill" else restart)(args[1])
        print(f"stack: {args[1]} {args[0]}ed")
    elif args == ["kill", "connect"]:  # started again by `connect`
        connect_kill()
        print("stack: connect killed")
    elif args in (["second-mariadb", "up"], ["second-mariadb", "down"]):
        second_mariadb_up() if args[1] == "up" else second_mariadb_down()
    elif args in (["binlog-mariadb", "up"], ["binlog-mariadb", "down"]):  # a change-data-capture source
        binlog_mariadb_up() if args[1] == "up" else binlog_mariadb_down()
    elif args in (["postgres", "up"], ["postgres", "down"]):  # the stack's PostgreSQL alone
        postgres_up() if args[1] == "up" else stop("PostgreSQL", POSTGRES_HOME / "postgres.pid", signal.SIGINT)
    elif args in (["second-postgres", "up"], ["second-postgres", "down"]):
        second_postgres_up() if args[1] == "up" else second_postgres_down()
    elif args in (["kafka-cluster", "up"], ["kafka-cluster", "down"]):
        kafka_cluster_up() if args[1] == "up" else kafka_cluster_down()
    else:
        die("usage: stack.py up|down|status|clean|connect | kill|restart mariadb|postgres|kafka | kill connect "
            "| postgres up|down "
            "| second-mariadb up|down | binlog-mariadb up|down | second-postgres up|down | kafka-cluster up|down")
