"""``changes="debezium"`` with Avro and Protobuf values (bare and Confluent-framed): the recorded real Debezium events
(``tests/fixtures/debezium``) re-encoded in Avro / Protobuf (``tests/support/debezium_formats.py``: no Debezium here
writes Avro or Protobuf, no registry runs, its converters do not resolve from Maven Central) give the same rows,
deletes, skipped records, errors and positions as the JSON path gives for the same events; the row's columns from
``schema=`` or from the envelope's ``after``; a schema or envelope that does not fit refused with the reason; and one
run on real Kafka into a PostgreSQL table through ``PostgresUpsertSink``, then the same events re-sent (a no-op)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_eo.core.changes import CHANGE_OP, DELETE_OP, POSITION_COLUMN, postgres_position
from airflow_eo.core.config import DELETE_COLUMN, ParseConfig
from airflow_eo.core.errors import ConfigurationError
from tests.support.debezium_formats import (
    SCHEMA_IDS,
    avro_bytes,
    avro_schema,
    envelope_connect_schema,
    protobuf_bytes,
    protobuf_descriptor_set,
    recorded,
    table_of,
)
from tests.support.kafka_frames import kafka_frame

ROW = "id INT, name STRING, qty INT"
#: The cases of the tables' own topics (the transaction case's BEGIN / END records are on another topic, with another
#: schema: not change events of the envelope; see ``_table_records``).
CASES = ("read", "create", "update", "delete", "primary_key_change", "transaction", "default_identity", "truncate")
COMPARED = ("id", "name", "qty", DELETE_COLUMN, CHANGE_OP, POSITION_COLUMN, "_eo_skip", "_eo_error")


def _table_records() -> list[dict[str, Any]]:
    return [r for case in CASES for r in recorded(case) if table_of(r) in SCHEMA_IDS]


def _raw(spark: Any, records: list[dict[str, Any]], values: list[bytes | None]) -> Any:
    keys = [json.dumps(r["key"]).encode() if r["key"] is not None else None for r in records]
    return kafka_frame(spark, records, keys, values)


def _json_bytes(record: dict[str, Any]) -> bytes | None:
    value = record["value"]
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _avro_setup(framing: str) -> tuple[dict[str, Any], list[bytes | None], dict[str, Any]]:
    """The reader schema (the customers table's envelope), each record's Avro bytes (each table's records written
    with its own envelope schema, under its id when framed), and the options."""
    schemas = {t: avro_schema(envelope_connect_schema(t)) for t in SCHEMA_IDS}
    values = [None if r["value"] is None else avro_bytes(
        schemas[table_of(r)], r["value"]["payload"], SCHEMA_IDS[table_of(r)] if framing == "confluent" else None)
        for r in _table_records()]
    options: dict[str, Any] = {"avro_schema": json.dumps(schemas["eo_fixture_customers"])}
    if framing == "confluent":
        options["writer_schemas"] = {SCHEMA_IDS[t]: json.dumps(s) for t, s in schemas.items()}
    return schemas["eo_fixture_customers"], values, options


def _protobuf_setup(framing: str, folder: Path) -> tuple[list[bytes | None], dict[str, Any]]:
    from airflow_eo.spark.protobuf import message_class

    descriptors = protobuf_descriptor_set(envelope_connect_schema("eo_fixture_customers"))
    path = folder / "envelope.desc"
    path.write_bytes(descriptors.SerializeToString())
    name = "eo_fixture_schemas.public.eo_fixture_customers.Envelope"
    cls = message_class(path.read_bytes(), name)
    values = [None if r["value"] is None else protobuf_bytes(
        cls, r["value"]["payload"], SCHEMA_IDS[table_of(r)] if framing == "confluent" else None)
        for r in _table_records()]
    return values, {"protobuf_descriptor": str(path), "protobuf_message": name}


def _parsed(spark: Any, values: list[bytes | None], parse: ParseConfig) -> tuple[dict[tuple[str, int], tuple], list]:
    from airflow_eo.spark.parsing import parse_records

    parsed, payload = parse_records(spark, _raw(spark, _table_records(), values), parse)
    rows = {(r["kafka_topic"], r["kafka_offset"]): tuple(bytes(r[c]) if c == POSITION_COLUMN and r[c] else r[c]
                                                         for c in COMPARED) for r in parsed.collect()}
    return rows, payload


@pytest.mark.parametrize(("value_format", "framing", "schema"), [
    ("avro", "none", ROW), ("avro", "confluent", None), ("protobuf", "none", None), ("protobuf", "confluent", ROW)])
def test_avro_and_protobuf_change_events_parse_as_the_same_events_in_json(value_format, framing, schema, tmp_path):
    from airflow_eo.spark.session import get_session

    spark = get_session()
    records = _table_records()
    expected, json_payload = _parsed(spark, [_json_bytes(r) for r in records],
                                     ParseConfig("json", ROW, changes="debezium", change_keys=("id",)))
    if value_format == "avro":
        _, values, options = _avro_setup(framing)
    else:
        values, options = _protobuf_setup(framing, tmp_path)
    parse = ParseConfig(value_format, schema, framing=framing, changes="debezium", change_keys=("id",), **options)
    got, payload = _parsed(spark, values, parse)
    assert payload == json_payload == ["id", "name", "qty", DELETE_COLUMN]
    assert got == expected
    # What the JSON path gives, spelled out (test_change_parsing.py checks it against the events themselves): rows,
    # deletes by their before image, tombstones skipped, a truncate refused, positions as core's.
    by_op: dict[str, int] = {}
    for record in records:
        row = dict(zip(COMPARED, got[(record["topic"], record["offset"])], strict=True))
        if record["value"] is None:
            assert row["_eo_skip"] and row["_eo_error"] is None
            continue
        event = record["value"]["payload"]
        by_op[event["op"]] = by_op.get(event["op"], 0) + 1
        if event["op"] == "t":
            assert "truncate" in row["_eo_error"]
            continue
        image = event["before"] if event["op"] == DELETE_OP else event["after"]
        assert row["_eo_error"] is None and (row["id"], row["name"], row["qty"]) == (image["id"], image["name"],
                                                                                       image["qty"])
        assert row[DELETE_COLUMN] == (event["op"] == DELETE_OP)
        source = event["source"]
        assert row[POSITION_COLUMN] == postgres_position(event["op"], source["lsn"], source["sequence"])
    assert by_op == {"r": 2, "c": 4, "u": 3, "d": 3, "t": 1}


def test_a_schema_or_envelope_that_does_not_fit_is_refused_saying_why(tmp_path):
    from airflow_eo.spark.parsing import parse_records
    from airflow_eo.spark.session import get_session

    spark = get_session()
    schema, values, options = _avro_setup("none")
    parse = ParseConfig("avro", "id INT, name STRING, qty BIGINT, note STRING", framing="none", changes="debezium",
                        change_keys=("id",), **options)
    with pytest.raises(ConfigurationError) as refused:
        parse_records(spark, _raw(spark, _table_records(), values), parse)
    assert "'qty' is bigint in schema but int in the envelope's 'after'" in str(refused.value)
    assert "'note' is not a field of the envelope's 'after' (id, name, qty)" in str(refused.value)
    # At DAG parse time: an Avro schema that is a row, not Debezium's envelope.
    row_only = next(f for f in schema["fields"] if f["name"] == "before")["type"][1]
    with pytest.raises(ConfigurationError, match="no Debezium change event envelope: it has no 'before', 'after', "
                                                 "'op', 'source'"):
        ParseConfig("avro", framing="none", avro_schema=json.dumps(row_only), changes="debezium", change_keys=("id",))
    # Protobuf: the operator reads the message at parse time.
    from airflow_eo.operators import KafkaMicroBatchOperator
    from airflow_eo.sinks import PostgresUpsertSink

    _, proto = _protobuf_setup("none", tmp_path)
    with pytest.raises(ConfigurationError, match="the envelope has no 'before', 'after', 'op', 'source'"):
        KafkaMicroBatchOperator(task_id="t", pipeline_id=f"p_{uuid.uuid4().hex[:8]}", topics=["t"],
                                sink=PostgresUpsertSink(table="t", key_columns=["id"]), value_format="protobuf",
                                framing="none", changes="debezium", protobuf_descriptor=proto["protobuf_descriptor"],
                                protobuf_message="eo_fixture_schemas.public.eo_fixture_customers.Value")


def test_avro_change_events_on_kafka_applied_to_postgres_then_re_sent_change_nothing(
        bootstrap, postgres_kwargs, topic_name):
    """The customers table's recorded events (its truncate left out: it fails the batch), Confluent-framed Avro, on a
    real topic; the operator applies them to a PostgreSQL table; the table equals the events replayed in source
    order; all of them produced again and applied: the table is unchanged (each change's position is not newer)."""
    from confluent_kafka import Producer

    from airflow_eo.sinks import PostgresUpsertSink
    from tests.support.kafka import create_topic
    from tests.support.operator_harness import operator, run

    schema = avro_schema(envelope_connect_schema("eo_fixture_customers"))
    records = [r for r in _table_records() if table_of(r) == "eo_fixture_customers"
               and (r["value"] is None or r["value"]["payload"]["op"] != "t")]
    # Expected: each key's newest change by source position (core's rule), replayed in Python.
    newest: dict[int, tuple[bytes, dict[str, Any]]] = {}
    for record in records:
        if record["value"] is not None:
            event = record["value"]["payload"]
            key = (event["before"] if event["op"] == DELETE_OP else event["after"])["id"]
            position = postgres_position(event["op"], event["source"]["lsn"], event["source"]["sequence"])
            if key not in newest or position > newest[key][0]:
                newest[key] = (position, event)
    expected = sorted((e["after"]["id"], e["after"]["name"], e["after"]["qty"]) for _, e in newest.values()
                      if e["op"] != DELETE_OP)
    assert expected == [(2, "two", 21), (4, "FOUR", 40), (10, "one", 10)]

    table = f"cdc_avro_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id INT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT NULL)")
    create_topic(bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": bootstrap})

    def produce() -> None:
        for record in records:
            value = None if record["value"] is None else avro_bytes(schema, record["value"]["payload"], 7)
            producer.produce(topic_name, key=json.dumps(record["key"]).encode(), value=value)
        assert producer.flush(30) == 0

    def target() -> list[tuple]:
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(f"SELECT id, name, qty FROM {table} ORDER BY id").fetchall()]

    try:
        produce()
        op = operator(topic_name, PostgresUpsertSink(table=table, key_columns=["id"]), schema=None,
                      value_format="avro", framing="confluent", avro_schema=json.dumps(schema),
                      writer_schemas={7: json.dumps(schema)}, changes="debezium")
        summary = run(op)
        assert summary["records_in"] == len(records) and summary["dead_letters"] == 0
        assert target() == expected
        produce()
        run(op)
        assert target() == expected
    finally:
        with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")

