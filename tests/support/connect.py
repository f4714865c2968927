"""The stack's Kafka Connect worker (``make connect``) and Debezium's PostgreSQL and MariaDB connectors, for tests
and for scripts/record_debezium_events.py.

:func:`connect_worker` (a session fixture) makes sure the worker runs, starting it with ``scripts/stack.py connect``
when it does not: one worker for the whole session (and after it: ``make down`` stops it). :func:`debezium` (a
fixture) registers connectors through Connect's REST API, each for one table with its own topic prefix,
replication slot and publication, and removes them (connector, slot, publication, topics) after the test.
:func:`mariadb_debezium` does the same with Debezium's MariaDB connector for a table of the binlog MariaDB
(:func:`binlog_mariadb`, ``scripts/stack.py binlog-mariadb up``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_eo.examples.customers import debezium_connector, postgres_connector

REPO = Path(__file__).resolve().parents[2]
STACK_SCRIPT = REPO / "scripts" / "stack.py"


def stack_connect() -> ModuleType:
    """``scripts/stack_connect.py`` (its REST client; the port is read from ``EO_STACK_CONNECT_PORT`` per call)."""
    spec = importlib.util.spec_from_file_location("eo_stack_connect", REPO / "scripts" / "stack_connect.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rest(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, answer = stack_connect().request(method, path, body, timeout=30)
    return int(status), answer


def ensure_worker(timeout: float = 600) -> str:
    """The worker's REST URL; started (``scripts/stack.py connect``, as ``make connect``) unless it answers."""
    module = stack_connect()
    if module.ready():
        return str(module.url())
    done = subprocess.run([sys.executable, str(STACK_SCRIPT), "connect"], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"stack.py connect failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert module.ready(), f"the Connect worker does not answer at {module.url()}:\n{done.stdout[-3000:]}"
    return str(module.url())


@pytest.fixture(scope="session")
def connect_worker() -> str:
    """The stack's Kafka Connect worker runs: its REST URL (e.g. ``http://127.0.0.1:28083``)."""
    return ensure_worker()


@dataclass
class DebeziumConnector:
    """A registered Debezium connector for one table: its topics and (PostgreSQL) the slot and publication it owns."""

    name: str  # also the topic prefix and, for PostgreSQL, the replication slot and the publication
    table: str
    schema: str  # MariaDB: the database
    config: dict[str, str]
    registered_at: float = 0.0
    streaming_at: float = 0.0
    source: str = "postgres"  # or "mariadb"

    @property
    def topic(self) -> str:
        """The table's change events."""
        return f"{self.name}.{self.schema}.{self.table}"

    @property
    def heartbeat_topic(self) -> str:
        return f"__debezium-heartbeat.{self.name}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.name}.transaction"

    def table_topic(self, table: str, schema: str = "public") -> str:
        """The change events of another table the connector captures (``table.include.list``)."""
        return f"{self.name}.{schema}.{table}"

    @property
    def topics(self) -> list[str]:
        tables = [f"{self.name}.{t.strip()}" for t in self.config["table.include.list"].split(",")]
        history = [self.config["schema.history.internal.kafka.topic"]] if self.source == "mariadb" else []
        return [*tables, self.heartbeat_topic, self.transaction_topic, *history]

    def status(self) -> dict[str, Any]:
        code, answer = rest("GET", f"/connectors/{self.name}/status")
        assert code == 200, f"status of {self.name}: HTTP {code} {answer}"
        return dict(answer)


def connector_config(postgres_kwargs: dict[str, Any], name: str, table: str, schema: str = "public",
                     schemas_enable: bool = True, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Debezium's PostgreSQL connector for ``schema.table`` of the stack's database, named ``name`` (also its topic
    prefix, slot and publication): ``pgoutput``, a publication of that table alone made by Debezium, truncates
    streamed (``skipped.operations=none``; Debezium skips them by default), transaction metadata and a heartbeat
    every 500 ms on. ``schemas_enable``: the JSON converter's schema/payload wrapper on keys and values;
    ``overrides``: any other settings."""
    config = {**postgres_connector(postgres_kwargs, name, table, schema, schemas_enable),
              "snapshot.mode": "initial", "skipped.operations": "none", "provide.transaction.metadata": "true",
              "heartbeat.interval.ms": "500"}
    config.update(overrides or {})
    return config


def register(postgres_kwargs: dict[str, Any], bootstrap: str, table: str, schema: str = "public",
             name: str | None = None, timeout: float = 120, schemas_enable: bool = True,
             overrides: dict[str, str] | None = None) -> DebeziumConnector:
    """``POST /connectors`` a Debezium connector for ``schema.table`` (see :func:`connector_config`); returns once
    its task runs and its snapshot is done (:func:`wait_until_streaming`)."""
    name = name or f"dbz_{uuid.uuid4().hex[:12]}"  # a replication slot's name: lower case, digits and _
    config = connector_config(postgres_kwargs, name, table, schema, schemas_enable, overrides)
    connector = DebeziumConnector(name, table, schema, config)
    connector.registered_at = time.monotonic()
    code, answer = rest("POST", "/connectors", {"name": name, "config": connector.config})
    assert code == 201, f"POST /connectors: HTTP {code} {answer}"
    wait_until_streaming(connector, postgres_kwargs, bootstrap, timeout)
    connector.streaming_at = time.monotonic()
    return connector


def running(connector: DebeziumConnector) -> bool:
    """The connector and its task are RUNNING; a FAILED one fails the test with Connect's trace."""
    code, status = rest("GET", f"/connectors/{connector.name}/status")
    if code != 200:  # not yet known to the status topic
        return False
    states = [status["connector"]] + status["tasks"]
    failed = [s for s in states if s["state"] == "FAILED"]
    assert not failed, f"connector {connector.name} failed: {failed[0].get('trace', failed[0])}"
    return bool(status["tasks"]) and all(s["state"] == "RUNNING" for s in states)


def slot_active(postgres_kwargs: dict[str, Any], slot: str) -> bool:
    import psycopg

    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return bool(row and row[0])


def end_offset(bootstrap: str, topic: str) -> int:
    """The high watermark of the topic's partition 0; 0 while the topic does not exist."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"eo-watermark-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1])
    except KafkaException:
        return 0
    finally:
        consumer.close()


def snapshot_committed(connector: DebeziumConnector) -> bool:
    """The worker has committed a source offset of the connector past its snapshot (``GET .../offsets``, Kafka
    3.5+): ``snapshot_completed``, or a streaming offset. Before that, a connector whose worker dies takes its
    snapshot again when it restarts (seen: a worker SIGKILLed within a second of a registration re-read the table,
    ``op`` r)."""
    code, answer = rest("GET", f"/connectors/{connector.name}/offsets")
    if code != 200 or not answer["offsets"]:
        return False
    offset = answer["offsets"][0]["offset"]
    return "snapshot" not in offset or bool(offset.get("snapshot_completed"))


def wait_until_streaming(connector: DebeziumConnector, postgres_kwargs: dict[str, Any], bootstrap: str,
                         timeout: float = 120) -> None:
    """Until the connector's task runs and its snapshot is done: a heartbeat was written (Debezium writes the first
    once the snapshot is complete), the replication slot is held by the streaming connection (a slot is created
    before the snapshot and taken only when streaming starts) and the worker has committed an offset past the
    snapshot (:func:`snapshot_committed`; offsets are committed every second). A change committed after this
    returns is streamed (``op`` c/u/d/t), never read by the snapshot (``r``), even across a restart of the worker."""
    deadline = time.monotonic() + timeout
    while not running(connector):
        assert time.monotonic() < deadline, (
            f"{connector.name} not RUNNING in {timeout}s: {connector.status()}; {slot_blockers(postgres_kwargs)}")
        time.sleep(0.2)
    while not (end_offset(bootstrap, connector.heartbeat_topic) > 0 and slot_active(postgres_kwargs, connector.name)
               and snapshot_committed(connector)):
        assert running(connector)
        assert time.monotonic() < deadline, (
            f"connector {connector.name}'s snapshot not done in {timeout}s; {slot_blockers(postgres_kwargs)}")
        time.sleep(0.2)


def slot_blockers(postgres_kwargs: dict[str, Any]) -> str:
    """What keeps a new replication slot from being made: PostgreSQL creates one only once every transaction
    running at that moment has ended, prepared ones included (a two-phase sink's transaction left in doubt holds
    every new Debezium connector until it is committed or rolled back)."""
    import psycopg

    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        prepared = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
        open_transactions = conn.execute(
            "SELECT pid, state, left(query, 100) FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
            "AND pid <> pg_backend_pid()").fetchall()
    return f"prepared transactions: {prepared}; sessions with an open transaction: {open_transactions}"


def remove(connector: DebeziumConnector, postgres_kwargs: dict[str, Any] | None, bootstrap: str,
           timeout: float = 60, forget_offsets: bool = False, delete_topics: bool = True) -> None:
    """``DELETE /connectors/{name}``, then (PostgreSQL) drop its replication slot and its publication, and delete its
    topics. ``forget_offsets``: first stop it and delete its source offsets (Kafka
    3.6+'s ``DELETE /connectors/{name}/offsets``), so that a connector registered again under the name starts
    afresh with a snapshot instead of resuming from them. ``delete_topics=False`` keeps its topics (a connector
    registered again under the name writes on into them)."""
    from confluent_kafka.admin import AdminClient

    if forget_offsets and rest("GET", f"/connectors/{connector.name}")[0] == 200:
        code, answer = rest("PUT", f"/connectors/{connector.name}/stop")
        assert code in (202, 204), f"PUT /connectors/{connector.name}/stop: HTTP {code} {answer}"
        deadline = time.monotonic() + timeout
        while connector.status()["connector"]["state"] != "STOPPED" or connector.status()["tasks"]:
            assert time.monotonic() < deadline, f"{connector.name} not STOPPED: {connector.status()}"
            time.sleep(0.2)
        code, answer = rest("DELETE", f"/connectors/{connector.name}/offsets")
        assert code == 200, f"DELETE /connectors/{connector.name}/offsets: HTTP {code} {answer}"
    code, answer = rest("DELETE", f"/connectors/{connector.name}")
    assert code in (204, 404), f"DELETE /connectors/{connector.name}: HTTP {code} {answer}"
    if connector.source == "postgres":
        assert postgres_kwargs is not None
        drop_slot_and_publication(connector, postgres_kwargs, timeout)
    if not delete_topics:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=10).topics
    doomed = [t for t in connector.topics if t in existing]
    for future in (admin.delete_topics(doomed, operation_timeout=30).values() if doomed else []):
        with contextlib.suppress(Exception):
            future.result()


def drop_slot_and_publication(connector: DebeziumConnector, postgres_kwargs: dict[str, Any], timeout: float) -> None:
    """A removed PostgreSQL connector's replication slot (once its stopped task lets it go) and publication."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                               (connector.name,)).fetchone()
            if row is None:
                break
            if row[0] is None:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (connector.name,))
                break
            if time.monotonic() > deadline:  # a task that does not stop: its WAL sender goes
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            time.sleep(0.2)
        conn.execute(f'DROP PUBLICATION IF EXISTS "{connector.name}"')


@dataclass
class Connectors:
    """Registers Debezium connectors for a test; removes them after it."""

    postgres_kwargs: dict[str, Any]
    bootstrap: str
    registered: list[DebeziumConnector] = field(default_factory=list)

    def __call__(self, table: str, schema: str = "public", schemas_enable: bool = True,
                 overrides: dict[str, str] | None = None) -> DebeziumConnector:
        connector = register(self.postgres_kwargs, self.bootstrap, table, schema, schemas_enable=schemas_enable,
                             overrides=overrides)
        self.registered.append(connector)
        return connector

    def close(self) -> None:
        for connector in self.registered:
            remove(connector, self.postgres_kwargs, self.bootstrap)


@pytest.fixture
def debezium(connect_worker: str, postgres_kwargs: dict[str, Any], bootstrap: str) -> Iterator[Connectors]:
    """``debezium(table, schemas_enable=..., overrides=...)``: a Debezium PostgreSQL connector for the table,
    streaming; removed after the test with its slot, publication and topics."""
    connectors = Connectors(postgres_kwargs, bootstrap)
    try:
        yield connectors
    finally:
        connectors.close()


def mariadb_connector_config(mariadb_kwargs: dict[str, Any], bootstrap: str, name: str, table: str) -> dict[str, str]:
    """Debezium's MariaDB connector for ``table`` of the binlog MariaDB's database, named ``name`` (also its topic
    prefix): a snapshot, then the binlog; truncates streamed, transaction metadata and a heartbeat every 500 ms on,
    Connect's JSON converter without its wrapper."""
    database = str(mariadb_kwargs["database"])
    return {
        **debezium_connector("io.debezium.connector.mariadb.MariaDbConnector", mariadb_kwargs, name),
        # The connector reads the binlog as a replica does, under a server id no other replica of the source has.
        "database.server.id": str(random.randint(10_000, 2**31 - 1)),
        "database.include.list": database,
        "table.include.list": f"{database}.{table}",
        # The tables' DDL as the binlog went (the connector decodes a row event with the table's schema of its time).
        "schema.history.internal.kafka.bootstrap.servers": bootstrap,
        "schema.history.internal.kafka.topic": f"{name}.schema-history",
        "include.schema.changes": "false",
        "snapshot.mode": "initial",
        "skipped.operations": "none",
        "provide.transaction.metadata": "true",
        "heartbeat.interval.ms": "500",
    }


def register_mariadb(mariadb_kwargs: dict[str, Any], bootstrap: str, table: str,
                     timeout: float = 120) -> DebeziumConnector:
    """``POST /connectors`` Debezium's MariaDB connector for ``table`` (:func:`mariadb_connector_config`); returns
    once its task runs and its snapshot is done: a heartbeat written and an offset committed past the snapshot."""
    name = f"dbz_{uuid.uuid4().hex[:12]}"
    config = mariadb_connector_config(mariadb_kwargs, bootstrap, name, table)
    connector = DebeziumConnector(name, table, str(mariadb_kwargs["database"]), config, source="mariadb")
    connector.registered_at = time.monotonic()
    code, answer = rest("POST", "/connectors", {"name": name, "config": config})
    assert code == 201, f"POST /connectors: HTTP {code} {answer}"
    deadline = time.monotonic() + timeout
    while not (running(connector) and end_offset(bootstrap, connector.heartbeat_topic) > 0
               and snapshot_committed(connector)):
        assert time.monotonic() < deadline, f"{name}'s snapshot not done in {timeout}s: {connector.status()}"
        time.sleep(0.2)
    connector.streaming_at = time.monotonic()
    return connector


@pytest.fixture(scope="session")
def binlog_mariadb() -> dict[str, Any]:
    """pymysql arguments of the stack's binlog MariaDB (``scripts/stack.py binlog-mariadb up``: started unless it
    runs), a change-data-capture source."""
    from tests.support.stack import load_stack

    settings = load_stack().binlog_mariadb_up()
    return {key: settings[key] for key in ("host", "port", "user", "password", "database")}


@pytest.fixture
def mariadb_debezium(connect_worker: str, binlog_mariadb: dict[str, Any], bootstrap: str
                     ) -> Iterator[Callable[[str], DebeziumConnector]]:
    """``mariadb_debezium(table)``: Debezium's MariaDB connector for the binlog MariaDB's table, streaming; removed
    after the test with its topics."""
    registered: list[DebeziumConnector] = []

    def register_one(table: str) -> DebeziumConnector:
        registered.append(register_mariadb(binlog_mariadb, bootstrap, table))
        return registered[-1]

    try:
        yield register_one
    finally:
        for connector in registered:
            remove(connector, None, bootstrap)


@dataclass
class Record:
    """A record as Kafka holds it, its key and value decoded from JSON (``None``: a null key or value)."""

    offset: int
    key: Any
    value: Any
    raw_key: bytes | None
    raw_value: bytes | None

    @property
    def payload(self) -> Any:
        """The value without the JSON converter's schema/payload wrapper (when it has one)."""
        if isinstance(self.value, dict) and set(self.value) == {"schema", "payload"}:
            return self.value["payload"]
        return self.value


def read_records(bootstrap: str, topic: str, until: Callable[[list[Record]], bool], timeout: float = 60,
                 start: int = 0) -> list[Record]:
    """The records of the topic's partition 0 from ``start``, read until ``until(records)`` holds."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"eo-read-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "topic.metadata.refresh.interval.ms": 1000})
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        while not until(records):
            assert time.monotonic() < deadline, (
                f"{topic}: condition not met in {timeout}s; read {len(records)} records: "
                + "; ".join(str(r.payload)[:300] for r in records[-5:]))
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            key, value = message.key(), message.value()
            records.append(Record(message.offset() or 0, json.loads(key) if key is not None else None,
                                  json.loads(value) if value is not None else None, key, value))
    finally:
        consumer.close()
    return records
