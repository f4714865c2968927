"""Kafka: the stack's single-node KRaft broker (``.stack/kafka``), jars from Maven Central into the cache, and the
three-node KRaft cluster of the replicated-Kafka tests (``.stack/kafka-cluster``, not part of ``up``)."""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from pathlib import Path

from stack_services.layout import (
    CACHE,
    KAFKA_CLUSTER,
    KAFKA_CLUSTER_PORTS,
    KAFKA_CONTROLLER_PORT,
    KAFKA_PORT,
    REPO,
    STACK,
)
from stack_services.processes import die, pid_alive, port_open, require, spawn, stop_together, wait_for

KAFKA_POM = REPO / "scripts" / "kafka" / "pom.xml"
KAFKA_LOG4J = REPO / "scripts" / "kafka" / "log4j2.properties"


def kafka_version() -> str:
    text = KAFKA_POM.read_text()
    return text.split("<kafka.version>")[1].split("</kafka.version>")[0]


def kafka_jars() -> Path:
    """Resolve Kafka's runtime classpath from Maven Central once, into the cache."""
    jars = CACHE / f"kafka-{kafka_version()}" / "libs"
    if (jars / ".complete").exists():
        return jars
    require("java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)")
    mvn = require("mvn", "install Maven (Debian: apt-get install maven)")
    jars.mkdir(parents=True, exist_ok=True)
    print(f"stack: resolving Kafka {kafka_version()} from Maven Central into {jars}")
    subprocess.run(
        [mvn, "-q", "-B", "-f", str(KAFKA_POM), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={jars}"],
        check=True,
    )
    (jars / ".complete").touch()
    return jars


def kafka_up() -> str:
    bootstrap = os.environ.get("EO_KAFKA_BOOTSTRAP")
    if bootstrap:
        print(f"stack: using your Kafka at {bootstrap} (EO_KAFKA_BOOTSTRAP)")
        return bootstrap
    return local_kafka_up()


def local_kafka_up() -> str:
    """Start (or find running) the stack's own broker (``.stack/kafka``)."""
    return kafka_node_up(STACK / "kafka", 1, KAFKA_PORT, {1: KAFKA_CONTROLLER_PORT}, replicas=1)


def kafka_node_up(home: Path, node_id: int, port: int, voters: dict[int, int], replicas: int,
                  heap: str = "768m", cluster: str | None = None) -> str:
    """One KRaft node (broker and controller) of a quorum of ``voters`` (node id → controller port).

    ``replicas``: replication of the internal topics (offsets, transaction state) and default of new topics;
    with 3, ``min.insync.replicas`` is 2 so that a write survives the loss of any one node.
    """
    pid_file, log = home / "kafka.pid", home / "stdout.log"
    bootstrap = f"127.0.0.1:{port}"
    if pid_alive(pid_file):
        wait_for("Kafka", lambda: kafka_ready(bootstrap), 60, home / "server.log")
        print(f"stack: Kafka already running at {bootstrap}")
        return bootstrap
    if port_open(port):
        die(f"port {port} is taken by another process; set EO_STACK_KAFKA_PORT or "
            "EO_KAFKA_BOOTSTRAP to use that broker")
    java = require("java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)")
    jars = kafka_jars()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "server.properties"
    min_isr = 2 if replicas >= 3 else 1
    config.write_text("\n".join([
        "process.roles=broker,controller",
        f"node.id={node_id}",
        "controller.quorum.voters=" + ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(voters.items())),
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{voters[node_id]}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={home / 'data'}",
        "num.partitions=1",
        # One node: internal topics and transactions must work with a single replica; three: with two.
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={replicas}",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        f"share.coordinator.state.topic.replication.factor={replicas}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        "unclean.leader.election.enable=false",
        "group.initial.rebalance.delay.ms=0",
        "transaction.max.timeout.ms=900000",
        # Retention checks every 5s so data-loss tests need not wait long.
        "log.retention.check.interval.ms=5000",
        # DeleteRecords moves a partition's start in memory; a SIGKILLed broker restarts from the last
        # checkpoint of it (default every 60s), bringing the records back. The tests empty topics that way
        # and the fault tests kill the broker: checkpoint every second (wait_until_deleted_records_stay_deleted).
        "log.flush.start.offset.checkpoint.interval.ms=1000",
        "auto.create.topics.enable=false",
        "",
    ]))
    java_cmd = [java, "-Xms128m", f"-Xmx{heap}", "-XX:+UseG1GC",
                f"-Dkafka.logs.dir={home}",
                f"-Dlog4j2.configurationFile={KAFKA_LOG4J}",
                "-cp", f"{jars}/*"]
    if not (home / "data" / "meta.properties").exists():
        subprocess.run(
            # "--cluster-id=": an id may start with "-", which the tool would take for an option.
            java_cmd + ["kafka.tools.StorageTool", "format", f"--cluster-id={cluster or cluster_id()}",
                        "-c", str(config), "--ignore-formatted"],
            check=True, stdout=subprocess.DEVNULL,
        )
    spawn(java_cmd + ["kafka.Kafka", str(config)], log, pid_file)
    if len(voters) == 1:  # a node of a quorum answers only once a majority of it runs
        wait_for("Kafka", lambda: kafka_ready(bootstrap), 90, home / "server.log")
        print(f"stack: Kafka {kafka_version()} (KRaft) ready at {bootstrap}")
    return bootstrap


def cluster_id() -> str:
    # KRaft wants a base64url-encoded UUID (22 characters, no padding).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def kafka_ready(bootstrap: str) -> bool:
    """True when the broker answers a metadata request (not just an open port)."""
    host, port = bootstrap.rsplit(":", 1)
    if not port_open(int(port), host):
        return False
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=3)
        return bool(metadata.brokers)
    except Exception:
        return False

# --------------------------------------------------------------------------- replicated Kafka (tests)


def kafka_cluster_node(node_id: int) -> tuple[Path, int]:
    return KAFKA_CLUSTER / f"node-{node_id}", KAFKA_CLUSTER_PORTS[node_id]


def kafka_cluster_start(node_id: int) -> str:
    """Start (again) one node of the three-node cluster; the first start formats all with one cluster id."""
    KAFKA_CLUSTER.mkdir(parents=True, exist_ok=True)
    id_file = KAFKA_CLUSTER / "cluster.id"
    if not id_file.exists():
        id_file.write_text(cluster_id())
    home, port = kafka_cluster_node(node_id)
    voters = {n: p + 1 for n, p in KAFKA_CLUSTER_PORTS.items()}
    return kafka_node_up(home, node_id, port, voters, replicas=3, heap="512m", cluster=id_file.read_text())


def kafka_cluster_up() -> str:
    """A three-node KRaft cluster on loopback (``.stack/kafka-cluster``): every node a broker and a
    controller, topics and the transaction state log replicated three times with ``min.insync.replicas=2``.
    Not part of ``up``; returns the bootstrap servers."""
    bootstrap = ",".join(kafka_cluster_start(n) for n in KAFKA_CLUSTER_PORTS)
    wait_for("the Kafka cluster", lambda: kafka_cluster_ready(bootstrap), 120, KAFKA_CLUSTER / "node-1" / "server.log")
    print(f"stack: three-node Kafka cluster ready at {bootstrap}")
    return bootstrap


def kafka_cluster_ready(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        return len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=3).brokers) == 3
    except Exception:
        return False


def kafka_cluster_down() -> None:
    stop_together({f"Kafka cluster node {node_id}": kafka_cluster_node(node_id)[0] / "kafka.pid"
                   for node_id in KAFKA_CLUSTER_PORTS})

