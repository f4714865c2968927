"""Record real Debezium change events into tests/fixtures/debezium/, for unit tests of a change-event parser.

Usage (the stack up; the Connect worker is started when it does not run)::

    . .stack/env && .venv/bin/python scripts/record_debezium_events.py [--out tests/fixtures/debezium]

Two Debezium PostgreSQL connectors (``pgoutput``) capture the same tables of the stack's PostgreSQL at once, one with
the JSON converter's ``{"schema": ..., "payload": ...}`` wrapper (``schemas.enable=true``, the folder
``with_schema``) and one without (``without_schema``); then one change per transaction is made, and the records
Kafka holds are split into one file per case (:data:`CASES`). Each record keeps its topic, offset, timestamp,
headers, key and value (``null``: a null key or value, a tombstone's); the bytes Kafka held are
``json.dumps(x, separators=(",", ":"), ensure_ascii=False).encode()`` of the key or value (checked when recording).
``recording.json`` holds the versions, the tables and the connectors' settings. Positions, transaction ids and
times differ from one recording to the next; names do not (connectors ``eo_fixture_schemas``/``eo_fixture_plain``,
tables ``eo_fixture_customers``, ``eo_fixture_customers_default`` and ``eo_fixture_types``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.connect import (  # noqa: E402
    DebeziumConnector,
    Record,
    connector_config,
    ensure_worker,
    read_records,
    register,
    remove,
    rest,
)

FULL, DEFAULT, TYPES = "eo_fixture_customers", "eo_fixture_customers_default", "eo_fixture_types"
VARIANTS = {"with_schema": ("eo_fixture_schemas", True), "without_schema": ("eo_fixture_plain", False)}
TABLES = {
    FULL: f"CREATE TABLE {FULL} (id INT PRIMARY KEY, name TEXT NOT NULL, qty INT)",
    DEFAULT: f"CREATE TABLE {DEFAULT} (id INT PRIMARY KEY, name TEXT NOT NULL, qty INT)",
    TYPES: (f"CREATE TABLE {TYPES} (id INT PRIMARY KEY, amount NUMERIC(10, 2), price DOUBLE PRECISION, "
            "big BIGINT, flag BOOLEAN, day DATE, at_local TIMESTAMP(3), at TIMESTAMPTZ, data BYTEA, doc JSONB, "
            "tags TEXT[], uid UUID)"),
}
SETUP = [f"ALTER TABLE {FULL} REPLICA IDENTITY FULL",
         f"INSERT INTO {FULL} VALUES (1, 'one', 10), (2, 'two', 20)"]
# (case, its SQL (each statement its own transaction unless one string holds several), what it shows)
CHANGES: list[tuple[str, list[str], str]] = [
    ("create", [f"INSERT INTO {FULL} VALUES (3, 'three', NULL)"], "op c: an insert (qty NULL)"),
    ("update", [f"UPDATE {FULL} SET qty = 21 WHERE id = 2"],
     "op u with REPLICA IDENTITY FULL: before holds the whole old row"),
    ("delete", [f"DELETE FROM {FULL} WHERE id = 3"],
     "op d with REPLICA IDENTITY FULL (before: the whole old row), then its tombstone (see tombstone)"),
    ("primary_key_change", [f"UPDATE {FULL} SET id = 10 WHERE id = 1"],
     "an update of the primary key: d of the old key, its tombstone, c of the new key (one LSN for both)"),
    ("transaction", [f"BEGIN; INSERT INTO {FULL} VALUES (4, 'four', 40); "
                     f"UPDATE {FULL} SET name = 'FOUR' WHERE id = 4; COMMIT"],
     "a transaction of two changes: BEGIN and END on the transaction topic (provide.transaction.metadata) "
     "and its two change events, each naming the transaction and its order in it"),
    ("default_identity", [f"INSERT INTO {DEFAULT} VALUES (1, 'a', 1)", f"UPDATE {DEFAULT} SET qty = 2 WHERE id = 1",
                          f"DELETE FROM {DEFAULT} WHERE id = 1"],
     "c, u, d and tombstone of a table with PostgreSQL's default replica identity (the primary key): an update's "
     "before is null; a delete's before holds the key, '' for the NOT NULL text column and null for qty"),
    ("types", [f"INSERT INTO {TYPES} VALUES (1, 12345.67, 1.5, 9007199254740993, true, '2024-02-29', "
               "'2024-02-29 12:34:56.789', '2024-02-29 12:34:56.789+02', '\\x00ff10', '{\"a\": [1, 2]}', "
               "'{x,y}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')",
               f"INSERT INTO {TYPES} (id) VALUES (2)"],
     "op c of a row of several column types with Debezium's default mappings (NUMERIC: base64 of the unscaled "
     "value, decimal.handling.mode=precise; dates: days since the epoch; TIMESTAMP: epoch ms; TIMESTAMPTZ: an ISO "
     "string in UTC; BYTEA: base64), and of a row of NULLs"),
    ("truncate", [f"TRUNCATE {FULL}"],
     "op t (Debezium skips truncates unless skipped.operations leaves them out: set to none): null key, "
     "null before/after"),
]
EXPECTED_OPS: dict[str, list[str | None]] = {FULL: ["r", "r", "c", "u", "d", None, "d", None, "c", "c", "u", "t"],
                DEFAULT: ["c", "u", "d", None], TYPES: ["c", "c"]}


def postgres_kwargs() -> dict[str, Any]:
    uri = os.environ.get("AIRFLOW_CONN_POSTGRES_DEFAULT")
    if not uri:
        sys.exit("AIRFLOW_CONN_POSTGRES_DEFAULT is not set: `. .stack/env` first")
    parts = urlsplit(uri)
    return {"host": parts.hostname, "port": parts.port or 5432, "user": unquote(parts.username or ""),
            "password": unquote(parts.password or ""), "dbname": unquote(parts.path.lstrip("/"))}


def sql(kwargs: dict[str, Any], *statements: str) -> None:
    import psycopg

    with psycopg.connect(**kwargs, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def op(record: Record) -> str | None:
    return None if record.value is None else str(record.payload["op"])


def as_json(record: Record, topic: str, partition: int = 0) -> dict[str, Any]:
    for raw, decoded in ((record.raw_key, record.key), (record.raw_value, record.value)):
        if raw is not None:  # the file reproduces Kafka's bytes exactly
            assert json.dumps(decoded, separators=(",", ":"), ensure_ascii=False).encode() == raw, raw[:200]
    return {"topic": topic, "partition": partition, "offset": record.offset, "key": record.key,
            "value": record.value}


def at_least(count: int) -> Callable[[list[Record]], bool]:
    return lambda got: len(got) >= count


def record_variant(bootstrap: str, connector: DebeziumConnector) -> dict[str, list[dict[str, Any]]]:
    """The cases' records of one connector (the changes already made)."""
    data = {table: read_records(bootstrap, connector.table_topic(table), at_least(len(ops)), timeout=120)
            for table, ops in EXPECTED_OPS.items()}
    for table, ops in EXPECTED_OPS.items():
        got = [op(r) for r in data[table]]
        assert got == ops, f"{connector.name} {table}: ops {got}, expected {ops}"
    full, default, types = data[FULL], data[DEFAULT], data[TYPES]
    topic = connector.table_topic
    # A transaction's id is "txId:LSN", the LSN of its first change for BEGIN and the changes, of its commit for END.
    txid = str(full[9].payload["transaction"]["id"]).split(":")[0]

    def of_txid(got: list[Record]) -> list[Record]:
        return [r for r in got if str(r.payload["id"]).split(":")[0] == txid]

    begin_end = of_txid(read_records(bootstrap, connector.transaction_topic, lambda got: len(of_txid(got)) >= 2))
    assert [r.payload["status"] for r in begin_end] == ["BEGIN", "END"], begin_end
    heartbeat = read_records(bootstrap, connector.heartbeat_topic, lambda got: len(got) >= 1)[:1]
    return {
        "read": [as_json(r, topic(FULL)) for r in full[0:2]],
        "create": [as_json(full[2], topic(FULL))],
        "update": [as_json(full[3], topic(FULL))],
        "delete": [as_json(r, topic(FULL)) for r in full[4:6]],
        "tombstone": [as_json(full[5], topic(FULL))],
        "primary_key_change": [as_json(r, topic(FULL)) for r in full[6:9]],
        "transaction": [as_json(begin_end[0], connector.transaction_topic),
                        *(as_json(r, topic(FULL)) for r in full[9:11]),
                        as_json(begin_end[1], connector.transaction_topic)],
        "default_identity": [as_json(r, topic(DEFAULT)) for r in default],
        "types": [as_json(r, topic(TYPES)) for r in types],
        "truncate": [as_json(full[11], topic(FULL))],
        "heartbeat": [as_json(r, connector.heartbeat_topic) for r in heartbeat],
    }


ABOUT = {case: about for case, _, about in CHANGES} | {
    "read": "op r: the snapshot's reads of the rows there before the connector (source.snapshot first/last)",
    "tombstone": "the record after a delete: the deleted row's key, a null value",
    "heartbeat": "a record of the heartbeat topic (heartbeat.interval.ms): not a row",
}
STATEMENTS = {case: statements for case, statements, _ in CHANGES} | {"read": SETUP[1:], "tombstone": [],
                                                                       "heartbeat": []}


def connector_for(name: str, kwargs: dict[str, Any], schemas_enable: bool) -> DebeziumConnector:
    config = connector_config(kwargs, name, FULL, "public", schemas_enable,
                              {"table.include.list": ",".join(f"public.{t}" for t in TABLES)})
    return DebeziumConnector(name, FULL, "public", config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "debezium")
    args = parser.parse_args()
    kwargs, bootstrap = postgres_kwargs(), os.environ.get("EO_KAFKA_BOOTSTRAP", "")
    if not bootstrap:
        sys.exit("EO_KAFKA_BOOTSTRAP is not set: `. .stack/env` first")
    ensure_worker()
    # What a run cut short left behind: the connectors and their offsets (or a connector registered under the name
    # would resume from them instead of taking a snapshot: a deleted one's are forgotten through a stopped
    # stand-in), slots, publications, topics, tables.
    for name, schemas_enable in VARIANTS.values():
        stand_in = connector_for(name, kwargs, schemas_enable)
        if rest("GET", f"/connectors/{name}")[0] == 404:
            code, answer = rest("POST", "/connectors", {"name": name, "config": stand_in.config,
                                                        "initial_state": "STOPPED"})
            assert code == 201, f"POST /connectors (STOPPED): HTTP {code} {answer}"
        remove(stand_in, kwargs, bootstrap, forget_offsets=True)
    sql(kwargs, *(f"DROP TABLE IF EXISTS {t}" for t in TABLES), *TABLES.values(), *SETUP)
    connectors: dict[str, DebeziumConnector] = {}
    try:
        for variant, (name, schemas_enable) in VARIANTS.items():
            started = time.monotonic()
            connectors[variant] = register(
                kwargs, bootstrap, FULL, name=name, schemas_enable=schemas_enable,
                overrides={"table.include.list": ",".join(f"public.{t}" for t in TABLES)})
            print(f"{name}: streaming {time.monotonic() - started:.1f}s after POST /connectors")
        for _, statements, _ in CHANGES:
            sql(kwargs, *statements)
        recorded = {variant: record_variant(bootstrap, c) for variant, c in connectors.items()}
        with_schema = connectors["with_schema"]
        versions = {
            "kafka_connect": rest("GET", "/")[1]["version"],
            "debezium": next(p["version"] for p in rest("GET", "/connector-plugins")[1]
                             if p["class"] == with_schema.config["connector.class"]),
        }
        import psycopg

        with psycopg.connect(**kwargs, autocommit=True) as conn:
            versions["postgresql"] = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    finally:
        for connector in connectors.values():
            remove(connector, kwargs, bootstrap, forget_offsets=True)
        sql(kwargs, *(f"DROP TABLE IF EXISTS {t}" for t in TABLES))
    for variant, cases in recorded.items():
        folder = args.out / variant
        folder.mkdir(parents=True, exist_ok=True)
        for case, records in cases.items():
            document = {"case": case, "about": ABOUT[case], "sql": STATEMENTS[case],
                        "converter": {"class": "org.apache.kafka.connect.json.JsonConverter",
                                      "schemas.enable": VARIANTS[variant][1]},
                        "records": records}
            (folder / f"{case}.json").write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    hidden = {"database.password": "***"}
    recording = {
        "about": "Real Debezium change events recorded by scripts/record_debezium_events.py from the stack's "
                 "PostgreSQL through the stack's Kafka Connect worker; a record's bytes in Kafka are "
                 "json.dumps(key or value, separators=(',', ':'), ensure_ascii=False).encode().",
        "versions": versions,
        "tables": list(TABLES.values()),
        "setup": SETUP,
        "connectors": {variant: {**c.config, **hidden, "database.port": "<port>"}
                       for variant, c in connectors.items()},
    }
    (args.out / "recording.json").write_text(json.dumps(recording, indent=2) + "\n")
    print(f"recorded {sum(len(c) for c in recorded.values())} cases into {args.out}")


if __name__ == "__main__":
    main()
