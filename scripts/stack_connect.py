"""The stack's Kafka Connect worker, with Debezium's PostgreSQL and MariaDB connectors: ``python scripts/stack.py
connect``.

One worker in distributed mode on loopback (REST API on ``http://127.0.0.1:28083``, ``EO_STACK_CONNECT_PORT`` to
change it), its connector configurations, source offsets and statuses in topics of the stack's Kafka
(``eo-connect-configs``, ``eo-connect-offsets``, ``eo-connect-status``, one replica): registered connectors and
their progress survive a restart of the worker, as in production. Apache Kafka's ``connect-runtime`` (with the JSON
converter) at the broker's version and Debezium's PostgreSQL and MariaDB connectors (plugins, each in its own class
loader) come
from Maven Central into ``~/.cache/airflow-eo`` like the broker's jars. Its files are under ``.stack/connect``: the
worker's settings (``worker.properties``), its log (``connect.log``) and its pid.

``connect`` returns once the worker answers ``GET /connectors`` (it has joined its group and read its
configurations); run on a running worker it only waits for that, and it starts a worker again that was killed
(SIGKILL included). ``down`` stops it before the broker. Any client registers connectors with Connect's REST API
(``POST /connectors``); tests/support/connect.py registers Debezium's PostgreSQL connector for one table.

Every start logs one ERROR, "Failed to discover Converter ... CloudEventsConverter could not be instantiated": the
converter of Debezium 3.6.1 looks up ``JsonConverter.convertToConnect(Schema, JsonNode)`` by reflection, which Kafka
4.1's JSON converter no longer has (it takes a third argument). Only that converter is unusable; the connector and
the JSON converter are not affected.

Loaded by scripts/stack_services/connect.py, which passes the stack's folders and process helpers as ``stack``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONNECT_POM = HERE / "connect" / "pom.xml"
DEBEZIUM_POM = HERE / "connect" / "debezium-postgres" / "pom.xml"
# Debezium's MariaDB connector (its own version: scripts/connect/debezium-mariadb/pom.xml says why).
DEBEZIUM_MARIADB_POM = HERE / "connect" / "debezium-mariadb" / "pom.xml"
CONNECT_LOG4J = HERE / "connect" / "log4j2.properties"
GROUP_ID = "eo-connect"
TOPICS = {"config": "eo-connect-configs", "offset": "eo-connect-offsets", "status": "eo-connect-status"}
# A cold worker takes ~15 s on two idle cores to answer; a busy machine may take several times that.
READY_TIMEOUT_S = 240


def port() -> int:
    """The REST API's port: below the kernel's ephemeral ports, like the stack's others."""
    return int(os.environ.get("EO_STACK_CONNECT_PORT", "28083"))


def url() -> str:
    return f"http://127.0.0.1:{port()}"


def home(stack: Any) -> Path:
    return Path(stack.STACK) / "connect"


def pid_file(stack: Any) -> Path:
    return home(stack) / "connect.pid"


def debezium_version(pom: Path = DEBEZIUM_POM) -> str:
    text = pom.read_text()
    return text.split("<debezium.version>")[1].split("</debezium.version>")[0]


def resolve(stack: Any, pom: Path, into: Path, what: str, *properties: str) -> Path:
    """A pom's runtime classpath copied from Maven Central into ``into`` once (``.complete`` marks it done)."""
    if (into / ".complete").exists():
        return into
    mvn = stack.require("mvn", "install Maven (Debian: apt-get install maven)")
    into.mkdir(parents=True, exist_ok=True)
    print(f"stack: resolving {what} from Maven Central into {into}")
    subprocess.run([mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
                    f"-DoutputDirectory={into}", *properties], check=True)
    (into / ".complete").touch()
    return into


def worker_jars(stack: Any) -> Path:
    """Kafka Connect's runtime (``connect-runtime``, ``connect-json``, log4j2) at the broker's version."""
    version = stack.kafka_version()
    return resolve(stack, CONNECT_POM, Path(stack.CACHE) / f"kafka-connect-{version}" / "libs",
                   f"Kafka Connect {version}", f"-Dkafka.version={version}")


def plugin_path(stack: Any) -> Path:
    """The worker's ``plugin.path``: a folder whose subfolders are Debezium's PostgreSQL and MariaDB connectors,
    each with its jars (a plugin, in a class loader of its own; a jar directly in the folder would be a plugin of its
    own). One folder per pair of versions, so that no older version of a connector is found beside a newer one."""
    versions = {pom: debezium_version(pom) for pom in (DEBEZIUM_POM, DEBEZIUM_MARIADB_POM)}
    root = Path(stack.CACHE) / f"debezium-{versions[DEBEZIUM_POM]}-mariadb-{versions[DEBEZIUM_MARIADB_POM]}-plugins"
    for pom, connector, what in ((DEBEZIUM_POM, "debezium-connector-postgres", "PostgreSQL"),
                                 (DEBEZIUM_MARIADB_POM, "debezium-connector-mariadb", "MariaDB")):
        resolve(stack, pom, root / connector, f"Debezium's {what} connector {versions[pom]}")
    return root


def request(method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
    """One call of the worker's REST API: (HTTP status, the decoded JSON answer or None)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url() + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw) if raw else None
        except ValueError:
            return error.code, raw.decode(errors="replace")


def ready() -> bool:
    """The worker lists its connectors: it answers, has joined its group and read the config topic (before that,
    the REST API answers 409/500 "rebalance in progress"/"stale configuration")."""
    try:
        return request("GET", "/connectors", timeout=5)[0] == 200
    except OSError:
        return False


def worker_properties(stack: Any, bootstrap: str, plugins: Path) -> str:
    rest_port = port()
    settings = {
        "bootstrap.servers": bootstrap,
        "group.id": GROUP_ID,
        # Every listener on loopback, and the address other workers (none here) would forward requests to.
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(rest_port),
        "rest.advertised.listener": "http",
        # The JSON converter with its schema/payload wrapper, Connect's default; a connector may override both.
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "config.storage.topic": TOPICS["config"],
        "offset.storage.topic": TOPICS["offset"],
        "status.storage.topic": TOPICS["status"],
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.storage.partitions": "5",
        "status.storage.partitions": "1",
        # The broker does not create topics on first use (auto.create.topics.enable=false): a connector's topics
        # are created by the worker from the connector's topic.creation.default.* settings.
        "topic.creation.enable": "true",
        # Source offsets committed every second (default 60 s): a worker killed mid-stream re-sends at most the
        # last second's changes, not the last minute's.
        "offset.flush.interval.ms": "1000",
        # One worker: a lost worker's connectors and tasks go to the next one to join at once, not after the
        # default 5 minutes' wait for the lost one to come back.
        "scheduled.rebalance.max.delay.ms": "0",
        # A SIGKILLed worker leaves its group member behind until its session expires: the broker's minimum.
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "2000",
        "plugin.path": str(plugins),
        # Plugins found from their ServiceLoader manifests (Kafka's and Debezium's jars have them), not by
        # scanning every class of every jar: a few seconds less to start.
        "plugin.discovery": "service_load",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def up(stack: Any) -> str:
    """Start (or find running) the stack's worker; returns its REST URL once it lists its connectors."""
    folder, pids = home(stack), pid_file(stack)
    log = folder / "connect.log"
    bootstrap = stack.kafka_up()
    started = time.monotonic()
    jars, plugins = worker_jars(stack), plugin_path(stack)
    settings = worker_properties(stack, bootstrap, plugins)
    config = folder / "worker.properties"
    if stack.pid_alive(pids):
        if config.exists() and config.read_text() == settings:
            stack.wait_for("Kafka Connect", ready, READY_TIMEOUT_S, log)
            print(f"stack: Kafka Connect already running at {url()}")
            check_postgres(stack)
            return url()
        # A worker started with other settings (an earlier version of this script: other plugins): its registered
        # connectors and their offsets are in Kafka, so a restart with these settings loses nothing.
        print("stack: Kafka Connect runs with other settings; restarting it")
        down(stack)
    if stack.port_open(port()):
        stack.die(f"port {port()} is taken by another process; set EO_STACK_CONNECT_PORT")
    java = stack.require("java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)")
    folder.mkdir(parents=True, exist_ok=True)
    config.write_text(settings)
    spawned = time.monotonic()
    stack.spawn([java, "-Xms128m", "-Xmx768m", "-XX:+UseG1GC", f"-Dconnect.logs.dir={folder}",
                 f"-Dlog4j2.configurationFile={CONNECT_LOG4J}", "-cp", f"{jars}/*",
                 "org.apache.kafka.connect.cli.ConnectDistributed", str(config)],
                folder / "stdout.log", pids)

    def answers() -> bool:
        if not stack.pid_alive(pids):
            tail = (folder / "stdout.log").read_text(errors="replace")[-2000:]
            stack.die(f"Kafka Connect exited while starting; see {log}; last output:\n{tail}")
        return ready()

    stack.wait_for("Kafka Connect", answers, READY_TIMEOUT_S, log)
    now = time.monotonic()
    print(f"stack: Kafka Connect {stack.kafka_version()} with Debezium {debezium_version()} (PostgreSQL), "
          f"{debezium_version(DEBEZIUM_MARIADB_POM)} (MariaDB) ready at {url()} "
          f"({now - spawned:.1f}s from start, {now - started:.1f}s with the jars)")
    check_postgres(stack)
    return url()


def check_postgres(stack: Any) -> None:
    """Debezium's PostgreSQL connector needs the server's ``wal_level=logical``; the stack's server has it from its
    start (scripts/stack.py's POSTGRES_SETTINGS), a server started before that setting has not: say so. The stack's
    ``eo`` role is a superuser, which may create replication slots and publications; it is also given REPLICATION
    (the attribute a non-superuser would need) if a server made before that lacks it."""
    settings = stack.postgres_settings()
    try:
        import psycopg

        with psycopg.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                             password=settings["password"], dbname=settings["database"], connect_timeout=3,
                             autocommit=True) as conn:
            wal_level = (conn.execute("SHOW wal_level").fetchone() or ("?",))[0]
            role = conn.execute("SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user").fetchone()
            if not settings["external"] and role == (True, False):
                conn.execute(f'ALTER ROLE "{settings["user"]}" REPLICATION')
    except Exception as error:  # PostgreSQL down or not installed: Connect itself does not need it
        print(f"stack: note: PostgreSQL at {settings['host']}:{settings['port']} not checked for Debezium ({error})")
        return
    if wal_level != "logical":
        print(f"stack: note: PostgreSQL at {settings['host']}:{settings['port']} runs with wal_level={wal_level}; "
              "Debezium's PostgreSQL connector needs wal_level=logical"
              + ("" if settings["external"] else
                 " (a server started before the stack set it: `python scripts/stack.py postgres down` then "
                 "`make up` starts it with it)"))


def kill(stack: Any) -> int:
    """SIGKILL the worker's process group, as a crash would; returns once it is gone."""
    pid = stack.pid_alive(pid_file(stack))
    if not pid:
        stack.die(f"Kafka Connect is not running (no live pid in {pid_file(stack)})")
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and stack.running(pid):
        time.sleep(0.05)
    return int(pid)


def down(stack: Any) -> None:
    """Stop the worker (SIGTERM: its tasks stop and commit their offsets; SIGKILL after 30 s)."""
    stack.stop("Kafka Connect", pid_file(stack))
