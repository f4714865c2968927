"""Topic formats through the operator, on real Kafka, Spark and MariaDB: keys, headers and metadata in the
transform; Avro values (bare and Confluent-framed, several writer versions in one batch) checked against
``fastavro`` as an independent decoder; bad records dead-lettered byte for byte, or failing with nothing committed.
"""

from __future__ import annotations

import io
import json
import struct
import time
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer

from airflow_eo.core.errors import BadRecordError
from airflow_eo.core.headers import decode_headers
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink
from tests.support.kafka import create_topic
from tests.support.operator_harness import rows, run


def _table(mysql_kwargs: dict[str, Any], columns: str) -> str:
    name = f"fmt_{uuid.uuid4().hex[:10]}"
    rows(mysql_kwargs, f"CREATE TABLE {name} ({columns})")
    return name


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]],
             timestamp_ms: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value, headers in records:
        producer.produce(topic, value, key, partition=0, headers=headers or None,
                         **({"timestamp": timestamp_ms} if timestamp_ms is not None else {}))
    producer.flush(30)


def _dead_letters(mysql_kwargs: dict[str, Any], pipeline_id: str) -> list[tuple]:
    """(offset, key, value, error, headers) of the pipeline's dead letters."""
    return [(int(o), None if k is None else bytes(k), None if v is None else bytes(v), e, decode_headers(h))
            for o, k, v, e, h in rows(mysql_kwargs, "SELECT kafka_offset, record_key, raw_value, error, kafka_headers "
                                      "FROM eo_dead_letter WHERE pipeline_id = %s ORDER BY kafka_offset",
                                      (pipeline_id,))]


def test_keys_headers_and_metadata_reach_the_transform(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 1)
    stamp = int(time.time() * 1000) - 60_000  # recent: an older record would fall to retention at once
    good = [(json.dumps({"user": f"u{i}", "region": i % 3}).encode(), json.dumps({"id": f"e{i}", "n": i}).encode(),
             [("source", f"app{i}".encode()), ("trace", bytes([0, 255, i]))]) for i in range(6)]
    bad_keys = [b"{not json \xff\xfe", json.dumps({"region": 1}).encode()]  # malformed; required field missing
    # their headers: a duplicate key, bytes that are not UTF-8, a null value; and none
    bad_headers: list[list[tuple[str, bytes | None]]] = [
        [("source", b"x"), ("trace", b"\xff\x00\xfe"), ("source", b"y"), ("null", None)], []]
    bad = [(k, json.dumps({"id": f"b{i}", "n": 0}).encode(), bad_headers[i]) for i, k in enumerate(bad_keys)]
    _produce(bootstrap, topic_name, [*good, *bad, (None, json.dumps({"id": "nokey", "n": 9}).encode(), [])],
             timestamp_ms=stamp)
    table = _table(mysql_kwargs, "id VARCHAR(16) PRIMARY KEY, key_user VARCHAR(16), region INT, source VARCHAR(16), "
                                 "trace VARBINARY(8), part INT, off BIGINT, ts DATETIME(3)")
    op = KafkaMicroBatchOperator(
        task_id="keys", pipeline_id=f"p_{topic_name}", topics=topic_name, schema="id STRING NOT NULL, n INT",
        key_format="json", key_schema="user STRING NOT NULL, region INT", on_bad_record="dead_letter",
        transform="SELECT id, key.user AS key_user, key.region AS region, "
                  "CAST(try_element_at(filter(kafka_headers, h -> h.key = 'source'), 1).value AS STRING) AS source, "
                  "try_element_at(filter(kafka_headers, h -> h.key = 'trace'), 1).value AS trace, "
                  "kafka_partition AS part, kafka_offset AS off, kafka_timestamp AS ts FROM kafka_batch",
        sink=MySqlUpsertSink(table=table, key_columns=["id"]),
    )
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (9, 7, 2)
    ts = datetime.fromtimestamp(stamp / 1000, timezone.utc).replace(tzinfo=None)
    expected = {(f"e{i}", f"u{i}", i % 3, f"app{i}", bytes([0, 255, i]), 0, i, ts) for i in range(6)}
    expected.add(("nokey", None, None, None, None, 0, 8, ts))  # no key: a NULL key column, not a bad record
    got = {(r[0], r[1], r[2], r[3], None if r[4] is None else bytes(r[4]), *r[5:]) for r in
           rows(mysql_kwargs, f"SELECT id, key_user, region, source, trace, part, off, ts FROM {table}")}
    assert got == expected
    dead = _dead_letters(mysql_kwargs, op.pipeline_id)
    assert [(d[0], d[1], d[2]) for d in dead] == [(6 + i, k, bad[i][1]) for i, k in enumerate(bad_keys)]
    assert [d[4] for d in dead] == [tuple(h) for h in bad_headers]  # byte for byte, in order
    assert dead[0][3] == "key is not valid UTF-8" and dead[1][3] == "key: required field 'user' is missing or null"


# Three writer versions of one record, and the reader schema (version 3). Version 1 has a field later removed
# (legacy), an int later promoted to long (qty), a nested record without a field later added with a default (tier);
# version 3 adds channel with a default.
PRICE = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
TS = {"type": "long", "logicalType": "timestamp-micros"}
DAY = {"type": "int", "logicalType": "date"}


def _order(version: int) -> dict[str, Any]:
    customer = [{"name": "name", "type": "string"}] + ([{"name": "tier", "type": "int", "default": 0}]
                                                       if version >= 2 else [])
    fields: list[dict[str, Any]] = [
        {"name": "order_id", "type": "string"},
        {"name": "qty", "type": "int" if version == 1 else "long"},
        {"name": "price", "type": PRICE},
        {"name": "placed_at", "type": TS},
        {"name": "day", "type": DAY},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": customer}},
    ]
    if version <= 2:
        fields.append({"name": "legacy", "type": "string"})
    if version >= 2:
        fields += [{"name": "note", "type": ["null", "string"], "default": None},
                   {"name": "blob", "type": ["null", "bytes"], "default": None}]
    if version >= 3:
        fields.append({"name": "channel", "type": "string", "default": "web"})
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": fields}


READER = _order(3)
KEY_SCHEMA = {"type": "record", "name": "OrderKey", "fields": [{"name": "region", "type": "string"}]}
INCOMPATIBLE = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "order_id", "type": "int"}]}
KEY_ID, INCOMPATIBLE_ID, UNKNOWN_ID = 100, 4, 77
ORDERS_TABLE = ("order_id VARCHAR(40) PRIMARY KEY, qty BIGINT NOT NULL, price DECIMAL(10,2) NOT NULL, "
                "placed_at DATETIME(6) NOT NULL, day DATE NOT NULL, customer_name VARCHAR(40) NOT NULL, "
                "customer_tier INT NOT NULL, note VARCHAR(100), blob_col VARBINARY(64), channel VARCHAR(10), "
                "region VARCHAR(10)")
FLATTEN = ("SELECT order_id, qty, price, placed_at, day, customer.name AS customer_name, customer.tier AS "
           "customer_tier, note, blob AS blob_col, channel, {region} AS region FROM kafka_batch")


def _avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + _avro(schema, record)


def _record(i: int, version: int) -> dict[str, Any]:
    record: dict[str, Any] = {
        "order_id": f"o{i}", "qty": i if version == 1 else 2**40 + i, "price": Decimal(f"{i}.{i % 100:02d}"),
        "placed_at": datetime(2026, 3, 1, 12, 0, i % 60, 123456 + i, tzinfo=timezone.utc),
        "day": date(2026, 3, 1 + i % 28), "customer": {"name": f"c{i}"}, "legacy": "old"}
    if version >= 2:
        record["customer"]["tier"] = i % 4
        record.update(note=None if i % 2 else f"note {i}", blob=None if i % 3 == 0 else bytes([i, 0, 255]))
    if version >= 3:
        record["channel"] = "app" if i % 2 else "store"
    return record


def _expected(payloads: list[tuple[dict[str, Any], bytes, str]]) -> set[tuple]:
    """Each record decoded by fastavro with its own writer schema, resolved into the reader schema."""
    reader = fastavro.parse_schema(READER)
    out = set()
    for writer, payload, region in payloads:
        r = fastavro.schemaless_reader(io.BytesIO(payload), fastavro.parse_schema(writer), reader)
        out.add((r["order_id"], r["qty"], r["price"], r["placed_at"].astimezone(timezone.utc).replace(tzinfo=None),
                 r["day"], r["customer"]["name"], r["customer"]["tier"], r["note"], r["blob"], r["channel"], region))
    return out


def _orders(mysql_kwargs: dict[str, Any], table: str) -> set[tuple]:
    return {(*r[:8], None if r[8] is None else bytes(r[8]), *r[9:]) for r in rows(
        mysql_kwargs, f"SELECT order_id, qty, price, placed_at, day, customer_name, customer_tier, note, blob_col, "
        f"channel, region FROM {table}")}


def test_confluent_framed_avro_of_three_writer_versions_in_one_batch(bootstrap, mysql_kwargs, topic_name, tmp_path):
    """Writer schemas from a directory of <id>.avsc; keys are framed Avro too. Bad records of every kind are
    dead-lettered byte for byte, with an error naming the schema id."""
    create_topic(bootstrap, topic_name, 1)
    for schema_id, schema in ((1, _order(1)), (2, _order(2)), (3, READER), (KEY_ID, KEY_SCHEMA),
                              (INCOMPATIBLE_ID, INCOMPATIBLE)):
        (tmp_path / f"{schema_id}.avsc").write_text(json.dumps(schema))
    versions = [1, 2, 3]
    payloads: list[tuple[dict[str, Any], bytes, str]] = []
    records = []
    for i in range(30):  # the three versions interleaved
        version = versions[i % 3]
        value = _framed(version, _order(version), _record(i, version))
        key = _framed(KEY_ID, KEY_SCHEMA, {"region": f"r{i % 5}"})
        payloads.append((_order(version), value[5:], f"r{i % 5}"))
        records.append((key, value, [("v", str(version).encode())]))
    truncated = _framed(2, _order(2), _record(90, 2))[:-4]
    bad = [
        (b"k-unknown", _framed(UNKNOWN_ID, READER, _record(91, 3)), "value: unknown schema id 77"),
        (b"\xff\x00raw key", b"\x01" + _framed(3, READER, _record(92, 3))[1:], "not the Confluent magic byte"),
        (b"k-short", b"\x00\x00\x01", "value is 3 bytes, shorter than the Confluent header"),
        (None, truncated, "value: not an Avro record of writer schema id 2"),
        (b"k-incompatible", _framed(INCOMPATIBLE_ID, INCOMPATIBLE, {"order_id": 5}),
         "writer schema id 4 is incompatible with the reader schema"),
        (_framed(KEY_ID, KEY_SCHEMA, {"region": "r"})[:-1], _framed(3, READER, _record(93, 3)),
         "key: not an Avro record of writer schema id 100"),
    ]
    _produce(bootstrap, topic_name,
             records[:15] + [(k, v, [("n", bytes([0xff, i]))]) for i, (k, v, _) in enumerate(bad)] + records[15:])
    table = _table(mysql_kwargs, ORDERS_TABLE)
    op = KafkaMicroBatchOperator(
        task_id="avro", pipeline_id=f"p_{topic_name}", topics=topic_name, value_format="avro",
        avro_schema=json.dumps(READER), framing="confluent", writer_schemas=str(tmp_path), key_format="avro",
        key_schema=json.dumps(KEY_SCHEMA), on_bad_record="dead_letter", transform=FLATTEN.format(region="key.region"),
        sink=MySqlUpsertSink(table=table, key_columns=["order_id"]),
    )
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (36, 30, 6)
    want = _expected(payloads)
    got = _orders(mysql_kwargs, table)
    assert got == want
    assert {r[1] for r in got} >= {0, 2**40 + 1} and {r[9] for r in got} == {"web", "app", "store"}  # all versions
    dead = _dead_letters(mysql_kwargs, op.pipeline_id)
    assert [d[0] for d in dead] == list(range(15, 21))
    for i, ((offset, key, value, error, headers), (want_key, want_value, message)) in enumerate(
            zip(dead, bad, strict=True)):
        assert (key, value, headers) == (want_key, want_value, (("n", bytes([0xff, i])),)), offset
        assert message in error, (offset, error)
    assert "field 'order_id': reader type: STRING not compatible with writer type: INT" in dead[4][3]
    assert "field 'qty' is not in the writer schema and has no default" in dead[4][3]


def _claiming(schema_id: int, length: int, rest: bytes) -> bytes:
    """A framed Avro record whose first field (a string) claims ``length`` bytes: its zigzag varint, then ``rest``."""
    zigzag, prefix = length << 1, bytearray()
    while zigzag > 0x7F:
        prefix.append(zigzag & 0x7F | 0x80)
        zigzag >>= 7
    return b"\x00" + struct.pack(">I", schema_id) + bytes([*prefix, zigzag]) + rest


def test_a_record_claiming_a_huge_length_is_a_dead_letter_not_an_out_of_memory(bootstrap, mysql_kwargs, topic_name):
    """A value and a key whose first string claims 2 GiB - 64 bytes (under Java's array limit: without Avro's
    length limits from_avro allocates it, and the OutOfMemoryError kills the session's JVM, the executor of local
    mode): each a dead letter, the good records around them committed."""
    from airflow_eo.spark.session import AVRO_LIMIT_PROPERTIES, AVRO_MAX_LENGTH, get_session

    create_topic(bootstrap, topic_name, 1)
    huge = 2**31 - 64
    key = _framed(KEY_ID, KEY_SCHEMA, {"region": "r1"})
    good = [(key, _framed(3, READER, _record(i, 3)), []) for i in range(8)]
    poison = [(key, _claiming(3, huge, b"o-huge"), []), (_claiming(KEY_ID, huge, b"r"), good[0][1], [])]
    _produce(bootstrap, topic_name, good[:4] + poison + good[4:])
    table = _table(mysql_kwargs, ORDERS_TABLE)
    op = KafkaMicroBatchOperator(
        task_id="avro", pipeline_id=f"p_{topic_name}", topics=topic_name, value_format="avro",
        avro_schema=json.dumps(READER), framing="confluent",
        writer_schemas={3: json.dumps(READER), KEY_ID: json.dumps(KEY_SCHEMA)}, key_format="avro",
        key_schema=json.dumps(KEY_SCHEMA), on_bad_record="dead_letter",
        transform=FLATTEN.format(region="key.region"), sink=MySqlUpsertSink(table=table, key_columns=["order_id"]))
    summary = run(op)
    jvm = get_session()._jvm  # this process's session, the one that decoded: started with the limits
    assert [jvm.java.lang.System.getProperty(p) for p in AVRO_LIMIT_PROPERTIES] == [str(AVRO_MAX_LENGTH)] * 3
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (10, 8, 2)
    assert {r[0] for r in _orders(mysql_kwargs, table)} == {f"o{i}" for i in range(8)}
    dead = _dead_letters(mysql_kwargs, op.pipeline_id)
    assert [(d[0], d[1], d[2]) for d in dead] == [(4, *poison[0][:2]), (5, *poison[1][:2])]
    assert dead[0][3] == "value: not an Avro record of writer schema id 3 (truncated, corrupt, or claiming a length " \
                         "beyond Avro's limit)"
    assert dead[1][3].startswith("key: not an Avro record of writer schema id 100")
    committed = rows(mysql_kwargs, "SELECT next_offset FROM eo_offset WHERE pipeline_id = %s", (op.pipeline_id,))
    assert [int(c[0]) for c in committed] == [10]


def test_bare_avro_round_trip_then_a_truncated_record_fails_the_batch(bootstrap, mysql_kwargs, topic_name):
    """framing='none': records written with the reader schema; on_bad_record='fail' commits nothing."""
    create_topic(bootstrap, topic_name, 1)
    # A bare record whose first field is an empty string starts with byte 0, as a Confluent header would.
    first = {**_record(0, 3), "order_id": ""}
    values = [_avro(READER, first)] + [_avro(READER, _record(i, 3)) for i in range(1, 12)]
    assert values[0][0] == 0
    _produce(bootstrap, topic_name, [(str(i).encode(), v, []) for i, v in enumerate(values)])
    table = _table(mysql_kwargs, ORDERS_TABLE)
    op = KafkaMicroBatchOperator(
        task_id="avro", pipeline_id=f"p_{topic_name}", topics=topic_name, value_format="avro",
        avro_schema=json.dumps(READER), framing="none", key_format="string", transform=FLATTEN.format(region="key"),
        sink=MySqlUpsertSink(table=table, key_columns=["order_id"]),
    )
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"]) == (12, 12)
    want = _expected([(READER, v, str(i)) for i, v in enumerate(values)])
    assert _orders(mysql_kwargs, table) == want
    _produce(bootstrap, topic_name, [(b"t", _avro(READER, _record(50, 3))[:-3], []), (b"g", values[1], [])])
    with pytest.raises(BadRecordError, match=r"offset 12: value is not an Avro record of the reader schema"):
        run(op)
    assert _orders(mysql_kwargs, table) == want
    committed = rows(mysql_kwargs, "SELECT next_offset FROM eo_offset WHERE pipeline_id = %s", (op.pipeline_id,))
    assert [int(c[0]) for c in committed] == [12]


def test_sessions_get_spark_avro_at_pyspark_version_without_what_pyspark_ships():
    import pyspark

    from airflow_eo.spark.session import AVRO_LIMIT_PROPERTIES, AVRO_MAX_LENGTH, session_conf

    avro_jars = [j for j in session_conf({})["spark.jars"].split(",") if "spark-avro_" in j]
    assert [j.rsplit("/", 1)[-1] for j in avro_jars] == [f"spark-avro_2.13-{pyspark.__version__}.jar"]
    own = "/opt/jars/spark-avro_2.13-4.0.0.jar"
    assert [j for j in session_conf({"spark.jars": own})["spark.jars"].split(",") if "spark-avro_" in j] == [own]
    # Avro's length limits go to both JVMs' options, after the user's; a limit the user set is the user's.
    mine = "-Dorg.apache.avro.limits.string.maxLength=500000000"
    conf = session_conf({"spark.executor.extraJavaOptions": f"-Xss4m {mine}"})
    assert conf["spark.driver.extraJavaOptions"] == " ".join(f"-D{p}={AVRO_MAX_LENGTH}" for p in AVRO_LIMIT_PROPERTIES)
    assert conf["spark.executor.extraJavaOptions"] == (f"-Xss4m {mine} -D{AVRO_LIMIT_PROPERTIES[1]}={AVRO_MAX_LENGTH} "
                                                       f"-D{AVRO_LIMIT_PROPERTIES[2]}={AVRO_MAX_LENGTH}")


def test_ids_missing_from_writer_schemas_are_asked_of_the_lookup_once_per_batch():
    """The engine's ``schema_lookup`` (what a schema registry connection becomes): asked for the batch's ids that
    ``writer_schemas`` lacks, each once for keys and values together, and nothing else; an id it does not know, or
    refuses (a 4xx about that id), is a bad record saying why, and the rest of the batch decodes."""
    from pyspark.sql import functions as F

    from airflow_eo.core.config import ParseConfig
    from airflow_eo.kafka.schema_registry import refusal_for_id
    from airflow_eo.spark.parsing import parse_records
    from airflow_eo.spark.session import get_session

    spark = get_session()
    asked: list[int] = []
    refused_id = 13

    def lookup(schema_id: int) -> str | None:
        asked.append(schema_id)
        if schema_id == refused_id:
            raise refusal_for_id(schema_id, 403, "User is denied operation Read on Subject: orders-key") or \
                AssertionError("403 is about the id")
        return {2: json.dumps(_order(2)), KEY_ID: json.dumps(KEY_SCHEMA)}.get(schema_id)

    key = _framed(KEY_ID, KEY_SCHEMA, {"region": "r1"})
    records = [(key, _framed(1, _order(1), _record(1, 1))), (key, _framed(2, _order(2), _record(2, 2))),
               (key, _framed(2, _order(2), _record(4, 2))), (_framed(9, KEY_SCHEMA, {"region": "r"}),
                                                             _framed(9, READER, _record(3, 3))),
               (None, b"\x01\x00\x00\x00\x05"),
               (_framed(refused_id, KEY_SCHEMA, {"region": "r"}), _framed(2, _order(2), _record(5, 2)))]
    raw = spark.createDataFrame(
        [("t", 0, i, None, k, None, v) for i, (k, v) in enumerate(records)],
        "kafka_topic STRING, kafka_partition INT, kafka_offset BIGINT, kafka_timestamp TIMESTAMP, kafka_key BINARY, "
        "kafka_headers ARRAY<STRUCT<key: STRING, value: BINARY>>, kafka_value BINARY")
    parse = ParseConfig("avro", avro_schema=json.dumps(READER), framing="confluent",
                        writer_schemas={1: json.dumps(_order(1))}, key_format="avro", key_schema=json.dumps(KEY_SCHEMA))
    parsed, payload = parse_records(spark, raw, parse, lookup)
    got = parsed.orderBy("kafka_offset").select("order_id", "qty", "key", "_eo_error").collect()
    assert sorted(asked) == [2, 9, refused_id, KEY_ID]  # ids writer_schemas lacks, each once (id 1 is supplied)
    assert [tuple(r) for r in got[:3]] == [("o1", 1, ("r1",), None), ("o2", 2**40 + 2, ("r1",), None),
                                           ("o4", 2**40 + 4, ("r1",), None)]
    assert got[3]["_eo_error"] == "value: unknown schema id 9 (not in writer_schemas nor the schema registry)"
    assert "not the Confluent magic byte" in got[4]["_eo_error"]
    assert got[5]["_eo_error"] == (f"key: unknown schema id {refused_id} (not in writer_schemas; the schema registry "
                                   f"answered HTTP 403 for id {refused_id}: User is denied operation Read on Subject: "
                                   "orders-key)")
    assert parsed.where(F.col("_eo_error").isNull()).count() == 3 and payload[0] == "order_id"


def test_an_unpaired_surrogate_escape_in_json_is_a_bad_record_and_a_pair_or_an_escaped_backslash_is_not():
    """Spark's JSON reader turns ``"\\ud800"`` (a UTF-16 surrogate escape without its pair) into ``?``: the record
    would be stored altered, so it is a bad record; a pair is its character, and ``"\\\\ud800"`` (an escaped
    backslash, then text) is text. ``"\\\\ud800\\udc00"`` is an escaped backslash, the text ``ud800``, then an
    unpaired low surrogate: bad, though a high escape's text stands before it."""
    from airflow_eo.core.config import ParseConfig
    from airflow_eo.spark.parsing import parse_records
    from airflow_eo.spark.session import get_session

    values = [br'{"id": "a", "s": "\ud800"}', br'{"id": "b", "s": "x\udc00y"}', br'{"id": "c", "s": "\ud83d\ude00"}',
              br'{"id": "d", "s": "\\ud800"}', br'{"id": "e", "s": "\\\ud800"}', br'{"id": "f", "s": "\uD800\uDC00"}',
              br'{"id": "g", "s": "\uDBFF!"}', br'{"id": "h", "s": "plain \u00e9"}',
              br'{"id": "i", "s": "\udc00\ud800"}', br'{"id": "j", "s": "\\ud800\udc00"}',
              br'{"id": "k", "s": "\ud800\\\udc00"}', br'{"id": "l", "s": "\\\\\ud800\udc00"}']
    spark = get_session()
    raw = spark.createDataFrame(
        [("t", 0, i, None, None, None, v) for i, v in enumerate(values)],
        "kafka_topic STRING, kafka_partition INT, kafka_offset BIGINT, kafka_timestamp TIMESTAMP, kafka_key BINARY, "
        "kafka_headers ARRAY<STRUCT<key: STRING, value: BINARY>>, kafka_value BINARY")
    parsed, _ = parse_records(spark, raw, ParseConfig("json", schema="id STRING NOT NULL, s STRING"))
    got = {r["id"] or str(r["kafka_offset"]): (r["s"], r["_eo_error"])
           for r in parsed.orderBy("kafka_offset").collect()}
    unpaired = "value has an unpaired UTF-16 surrogate escape"
    assert {k for k, (_, error) in got.items() if error} == {"a", "b", "e", "g", "i", "j", "k"}
    assert all(got[k][1].startswith(unpaired) for k in "abegijk")
    assert (got["c"], got["d"], got["f"], got["h"], got["l"]) == (
        ("\U0001F600", None), ("\\ud800", None), ("\U00010000", None), ("plain \u00e9", None),
        ("\\\\\U00010000", None))
