"""For the fault tests: SIGKILL a service of the stack, as a crash would, and start it again on its data."""

from __future__ import annotations

import time
from pathlib import Path

from airflow_eo.core.failpoints import kill_and_wait
from stack_services.kafka import kafka_cluster_node, kafka_cluster_start, local_kafka_up
from stack_services.layout import MARIADB_PORT, POSTGRES_HOME, STACK
from stack_services.mariadb import mariadb_up
from stack_services.postgres import postgres_up
from stack_services.processes import die, pid_alive

PID_FILES = {"mariadb": STACK / "mariadb" / "mariadb.pid", "kafka": STACK / "kafka" / "kafka.pid",
             "postgres": POSTGRES_HOME / "postgres.pid"}


def kill(service: str) -> int:
    """SIGKILL the service's process and its descendants, as a crash of its machine would: no shutdown, no flush.

    Returns the killed pid; waits until they are gone (its ports and files are free for a restart).
    """
    pid = pid_alive(PID_FILES[service])
    if not pid:
        die(f"{service} is not running (no live pid in {PID_FILES[service]})")
    kill_and_wait(pid)
    return pid


def pid_file_of(service: str) -> Path:
    """``mariadb``, ``kafka``, or ``kafka-node-N`` (a node of the three-node cluster)."""
    if service.startswith("kafka-node-"):
        return kafka_cluster_node(int(service.rsplit("-", 1)[1]))[0] / "kafka.pid"
    return PID_FILES[service]


def start(service: str) -> None:
    """Start a killed service again on its data (crash recovery: InnoDB's redo log, Kafka's log
    recovery); returns once it answers (a cluster node: once it runs, it rejoins on its own)."""
    if service == "mariadb":
        mariadb_up(STACK / "mariadb", MARIADB_PORT)
    elif service == "postgres":
        postgres_up()
    elif service.startswith("kafka-node-"):
        kafka_cluster_start(int(service.rsplit("-", 1)[1]))
    else:
        local_kafka_up()


def restart(service: str) -> None:
    if pid_alive(PID_FILES[service]):
        kill(service)
    start(service)


# Kafka's LogManager writes its first log-start checkpoint 30s after the broker starts, then every
# log.flush.start.offset.checkpoint.interval.ms (1s here).
KAFKA_FIRST_CHECKPOINT_S = 30


def wait_until_deleted_records_stay_deleted() -> None:
    """Wait until records deleted with DeleteRecords stay deleted across a SIGKILL of the stack's broker.

    DeleteRecords moves a partition's start in memory only; a broker killed before its next log-start
    checkpoint comes back with the deleted records readable again (seen here: 500 deleted records back).
    """
    started = PID_FILES["kafka"].stat().st_mtime
    time.sleep(max(0.0, started + KAFKA_FIRST_CHECKPOINT_S - time.time()) + 2)
