"""Hostile but valid PostgreSQL names through both PostgreSQL sinks (real Kafka, Spark and PostgreSQL): a schema,
tables, columns and a dead-letter table whose names hold double quotes, dots, spaces, a backquote, mixed case,
unicode and reserved words, some 63 bytes long (PostgreSQL's limit), with values of every awkward kind (quotes,
commas, backslashes, newlines, unicode, empty text, NULL). One batch per sink; the rows read back equal the last
produced record per key, the bad records land in the dead-letter table. Names PostgreSQL cannot keep are refused at
parse time (tests/operators/test_postgres_sink_specs.py)."""

from __future__ import annotations

import json
import random
import uuid

from confluent_kafka import Producer

from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.postgres.sql import quote_identifier, quote_table
from airflow_eo.sinks import PostgresTwoPhaseSink, PostgresUpsertSink
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, run
from tests.support.postgres import pg_rows, prepared_gids
from tests.support.stores import MYSQL_STORE

# Column names: distinct even ignoring case (Spark resolves names case-insensitively by default).
KEY = 'Key "id".x'
COLUMNS = {KEY: "TEXT", "select": "TEXT", "User Name ü": "TEXT", "back`tick": "BIGINT",
           "ß" * 31 + "z": "TEXT"}  # 63 bytes
SPARK_TYPES = {"TEXT": "STRING", "BIGINT": "BIGINT"}
VALUES = ['plain', 'say "hi"', "it's", "a,b", "back\\slash", "new\nline", "", "日本語 ü", '"', ";DROP TABLE x;--",
          "tab\tsep", "\\N", "NULL"]
BAD = [b"{not json", b'{"select": 1, ', b"\xff\xfe"]


def ddl_name(name: str) -> str:
    """A Spark DDL field name, backquoted (a backquote doubled)."""
    return "`" + name.replace("`", "``") + "`"


def produce(bootstrap: str, topic: str, count: int) -> list[bytes]:
    rng = random.Random(20)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    values = []
    for i in range(count):
        key = i % (count - 5)  # the last 5 records write keys again: the last one wins
        record = {KEY: f"{VALUES[key % len(VALUES)]} #{key}",
                  "select": rng.choice(VALUES), "User Name ü": rng.choice([*VALUES, None]),
                  "back`tick": rng.choice([None, -1, 2**62, i]), "ß" * 31 + "z": rng.choice(VALUES)}
        values.append(json.dumps(record).encode())
    for i, value in enumerate(values):
        producer.produce(topic, value)
        if i == count // 2:
            for bad in BAD:
                producer.produce(topic, bad)
    assert producer.flush(30) == 0
    return values


def test_hostile_names_and_values_reach_both_postgres_sinks_as_produced(bootstrap, postgres_kwargs, topic_name):
    suffix = uuid.uuid4().hex[:6]
    schema = f'Sch"ema. select Ü {suffix}'
    tables = {"upsert": f'user "{suffix}".t', "two_phase": "é" * 28 + f"{suffix}."}
    assert len(tables["two_phase"].encode()) == 63
    dead = f'dead "letters" {suffix}.select'
    q_schema = quote_identifier(schema)
    pg_rows(postgres_kwargs, f"CREATE SCHEMA {q_schema}")
    columns = ", ".join(f"{quote_identifier(c)} {t}" for c, t in COLUMNS.items())
    for table in tables.values():
        pg_rows(postgres_kwargs, f"CREATE TABLE {q_schema}.{quote_identifier(table)} ({columns}, "
                                 f"PRIMARY KEY ({quote_identifier(KEY)}))")
    create_topic(bootstrap, topic_name, 1)  # one partition: the produced order is the offset order
    values = produce(bootstrap, topic_name, 60)
    truth: dict[str, tuple] = {}
    for value in values:  # the last record of a key wins
        record = json.loads(value)
        truth[record[KEY]] = tuple(record[c] for c in COLUMNS)
    spark_schema = ", ".join(f"{ddl_name(c)} {SPARK_TYPES[t]}" for c, t in COLUMNS.items())
    try:
        for kind, table in tables.items():
            # As a DAG names them: each part double-quoted as in SQL, an embedded quote doubled.
            qualified = f'{q_schema}.{quote_identifier(table)}'
            sink_class = PostgresUpsertSink if kind == "upsert" else PostgresTwoPhaseSink
            spec = sink_class(table=qualified, key_columns=[KEY],
                              dead_letter_table=f"{q_schema}.{quote_identifier(dead)}")
            op = operator(topic_name, spec, pipeline_id=f"pgnames_{kind}_{topic_name}", schema=spark_schema,
                          on_bad_record="dead_letter", write_partitions=2)
            summary = run(op)
            assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (
                len(values) + len(BAD), len(values), len(BAD)), summary
            select = ", ".join(quote_identifier(c) for c in COLUMNS)
            got = {r[0]: r for r in pg_rows(postgres_kwargs, f"SELECT {select} FROM {quote_table(qualified)}")}
            assert got == truth, kind
            letters = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(  # type: ignore[attr-defined]
                op.pipeline_id, None, 10)
            assert sorted(bytes(d["raw_value"]) for d in letters) == sorted(BAD), kind
            assert prepared_gids(postgres_kwargs, op.pipeline_id) == []
        # Both sinks' dead letters in the one table, by its exact name.
        assert pg_rows(postgres_kwargs, f"SELECT count(*) FROM {q_schema}.{quote_identifier(dead)}") == [
            (2 * len(BAD),)]
    finally:
        pg_rows(postgres_kwargs, f"DROP SCHEMA {q_schema} CASCADE")
