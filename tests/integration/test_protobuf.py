"""Protobuf values through the operator, on real Kafka, Spark and MariaDB: a descriptor set built with
``descriptor_pb2`` (nested messages, a repeated message, an enum, a map, proto3 ``optional``, an imported
``google.protobuf.Timestamp``), Confluent-framed and bare; the sink equals each produced record decoded by the
``protobuf`` library directly; bad records dead-lettered byte for byte, or failing the batch with nothing committed.
Protobuf keys (``key_format="protobuf"``) the same way: framed and bare, in the transform, bad keys, tombstones.
"""

from __future__ import annotations

import json
import struct
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2
from google.protobuf.message import DecodeError

from airflow_eo.core.errors import BadRecordError, ConfigurationError
from airflow_eo.core.headers import decode_headers
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink
from tests.support.kafka import create_topic
from tests.support.operator_harness import rows, run

F = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, kind: int, type_name: str = "", repeated: bool = False,
           oneof: int | None = None) -> F:
    field = F(name=name, number=number, type=kind, label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    if type_name:
        field.type_name = type_name
    if oneof is not None:  # proto3 `optional`: a synthetic oneof of its own
        field.oneof_index, field.proto3_optional = oneof, True
    return field


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """shop.proto: Order (the first message), Customer (with a nested Address), Other; keys.proto: OrderKey (the
    keys' message, using shop.proto's enum), Spare; and the Timestamp import."""
    shop = descriptor_pb2.FileDescriptorProto(name="shop.proto", package="shop", syntax="proto3",
                                              dependency=["google/protobuf/timestamp.proto"])
    shop.enum_type.add(name="Status").value.extend([descriptor_pb2.EnumValueDescriptorProto(name=n, number=i)
                                                    for i, n in enumerate(["UNKNOWN", "PAID", "SHIPPED"])])
    order = shop.message_type.add(name="Order")
    line = order.nested_type.add(name="Line")
    line.field.extend([_field("sku", 1, F.TYPE_STRING), _field("qty", 2, F.TYPE_INT32)])
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.extend([_field("key", 1, F.TYPE_STRING), _field("value", 2, F.TYPE_INT64)])
    order.oneof_decl.add(name="_note")
    order.field.extend([
        _field("order_id", 1, F.TYPE_STRING), _field("amount", 2, F.TYPE_SINT64), _field("big", 3, F.TYPE_UINT64),
        _field("status", 4, F.TYPE_ENUM, ".shop.Status"), _field("customer", 5, F.TYPE_MESSAGE, ".shop.Customer"),
        _field("lines", 6, F.TYPE_MESSAGE, ".shop.Order.Line", repeated=True),
        _field("tags", 7, F.TYPE_STRING, repeated=True), _field("note", 8, F.TYPE_STRING, oneof=0),
        _field("blob", 9, F.TYPE_BYTES), _field("score", 10, F.TYPE_DOUBLE), _field("gift", 11, F.TYPE_BOOL),
        _field("placed_at", 12, F.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
        _field("small", 13, F.TYPE_UINT32),
        _field("attrs", 14, F.TYPE_MESSAGE, ".shop.Order.AttrsEntry", repeated=True)])
    customer = shop.message_type.add(name="Customer")
    customer.nested_type.add(name="Address").field.append(_field("city", 1, F.TYPE_STRING))
    customer.field.extend([_field("name", 1, F.TYPE_STRING),
                           _field("address", 2, F.TYPE_MESSAGE, ".shop.Customer.Address")])
    shop.message_type.add(name="Other").field.append(_field("x", 1, F.TYPE_STRING))
    out = descriptor_pb2.FileDescriptorSet()
    timestamp_pb2.DESCRIPTOR.CopyToProto(out.file.add())  # as protoc --include_imports writes it: imports too
    out.file.append(shop)
    keys = out.file.add(name="keys.proto", package="shop", syntax="proto3", dependency=["shop.proto"])
    keys.message_type.add(name="OrderKey").field.extend([
        _field("region", 1, F.TYPE_STRING), _field("shard", 2, F.TYPE_SINT32),
        _field("status", 3, F.TYPE_ENUM, ".shop.Status"), _field("order_id", 4, F.TYPE_STRING)])
    keys.message_type.add(name="Spare").field.append(_field("y", 1, F.TYPE_STRING))
    return out


def _classes() -> dict[str, Any]:
    """The test's own message classes (a pool of its own, apart from the engine's)."""
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_set().file:
        pool.Add(f)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop.{n}"))
            for n in ("Order", "Customer", "Other", "OrderKey", "Spare")}


CLASSES = _classes()
Order = CLASSES["Order"]
STATUS = ["UNKNOWN", "PAID", "SHIPPED"]


def _order(i: int) -> bytes:
    order = Order(order_id=f"o{i}", amount=-(2**40) - i if i % 2 else i, big=2**64 - 1 - i if i % 3 else 0,
                  status=i % 3, tags=[f"t{j}" for j in range(i % 3)], blob=bytes([i, 0, 255]) if i % 4 else b"",
                  score=i / 4, gift=bool(i % 2), small=2**32 - 1 - i)
    if i % 5:  # some orders without a customer: NULL, not a struct of defaults
        order.customer.name = f"c{i}"
        if i % 2:
            order.customer.address.city = f"city{i}"
    for j in range(i % 4):
        order.lines.add(sku=f"s{i}.{j}", qty=j + 1)
    if i % 3 == 0:
        order.note = "" if i % 2 else f"note {i}"  # set, even to "": proto3 optional keeps presence
    if i % 2 == 0:
        order.placed_at.FromDatetime(datetime(2026, 3, 1, 12, 0, i % 60, 123456 + i))
    order.attrs.update({f"a{j}": j * i for j in range(i % 3)})
    return order.SerializeToString()


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([byte])
        out += bytes([byte | 0x80])


def _framed(payload: bytes, path: list[int] | None = None, schema_id: int = 7) -> bytes:
    """Confluent framing; ``path=None`` is the one-byte shortcut for ``[0]`` that serializers write."""
    indexes = b"\x00" if path is None else _zigzag(len(path)) + b"".join(_zigzag(i) for i in path)
    return b"\x00" + struct.pack(">I", schema_id) + indexes + payload


TABLE = ("order_id VARCHAR(20) PRIMARY KEY, amount BIGINT NOT NULL, big DECIMAL(20,0) NOT NULL, "
         "status VARCHAR(10) NOT NULL, customer_name VARCHAR(20), city VARCHAR(20), has_customer BOOLEAN NOT NULL, "
         "line_items TEXT NOT NULL, tags TEXT NOT NULL, note VARCHAR(20), blob_col VARBINARY(16) NOT NULL, "
         "score DOUBLE NOT NULL, gift BOOLEAN NOT NULL, placed_at DATETIME(6), small BIGINT NOT NULL, "
         "attrs TEXT NOT NULL")
FLATTEN = ("SELECT order_id, amount, big, status, customer.name AS customer_name, customer.address.city AS city, "
           "customer IS NOT NULL AS has_customer, to_json(lines) AS line_items, to_json(tags) AS tags, note, "
           "blob AS blob_col, score, gift, placed_at, small, to_json(map_entries(attrs)) AS attrs FROM kafka_batch")


def _expected(payloads: list[bytes]) -> set[tuple]:
    """Each value decoded by the protobuf library directly, in the table's shape."""
    out = set()
    for payload in payloads:
        m = Order.FromString(payload)
        has_customer = m.HasField("customer")
        placed = (datetime(1970, 1, 1) + timedelta(seconds=m.placed_at.seconds, microseconds=m.placed_at.nanos // 1000)
                  if m.HasField("placed_at") else None)
        lines = json.dumps([{"sku": x.sku, "qty": x.qty} for x in m.lines], separators=(",", ":"))
        attrs = json.dumps([{"key": k, "value": v} for k, v in m.attrs.items()], separators=(",", ":"))
        out.add((m.order_id, m.amount, Decimal(m.big), STATUS[m.status], m.customer.name if has_customer else None,
                 m.customer.address.city if m.customer.HasField("address") else None, has_customer, lines,
                 json.dumps(list(m.tags), separators=(",", ":")), m.note if m.HasField("note") else None,
                 m.blob, m.score, m.gift, placed, m.small, attrs))
    return out


def _sink_rows(mysql_kwargs: dict[str, Any], table: str) -> set[tuple]:
    got = set()
    for r in rows(mysql_kwargs, f"SELECT order_id, amount, big, status, customer_name, city, has_customer, "
                                f"line_items, tags, note, blob_col, score, gift, placed_at, small, attrs FROM {table}"):
        # map_entries keeps the wire order of a map, which the library's dict need not: compare as sets
        attrs = json.dumps(sorted(json.loads(r[15]), key=lambda e: e["key"]), separators=(",", ":"))
        got.add((*r[:6], bool(r[6]), *r[7:10], bytes(r[10]), r[11], bool(r[12]), r[13], r[14], attrs))
    return got


def _sorted_attrs(want: set[tuple]) -> set[tuple]:
    return {(*w[:15], json.dumps(sorted(json.loads(w[15]), key=lambda e: e["key"]), separators=(",", ":")))
            for w in want}


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(topic, value, key, partition=0, headers=[("h", b"\x00\xff")])
    producer.flush(30)


def _table(mysql_kwargs: dict[str, Any]) -> str:
    name = f"pb_{uuid.uuid4().hex[:10]}"
    rows(mysql_kwargs, f"CREATE TABLE {name} ({TABLE})")
    return name


@pytest.fixture
def descriptor_file(tmp_path: Path) -> str:
    path = tmp_path / "shop.desc"
    path.write_bytes(descriptor_set().SerializeToString())
    return str(path)


def test_confluent_framed_protobuf_with_bad_records_dead_lettered(bootstrap, mysql_kwargs, topic_name,
                                                                  descriptor_file):
    create_topic(bootstrap, topic_name, 1)
    payloads = [_order(i) for i in range(24)]
    # the serializers' one-byte [0] and the explicit list [0] both name the first message, Order
    values = [_framed(p, None if i % 2 else [0], schema_id=7 + i % 2) for i, p in enumerate(payloads)]
    good = _order(99)
    truncated = _framed(good[:-3])
    with pytest.raises(DecodeError):  # the premise: the library itself refuses it
        Order.FromString(good[:-3])
    bad = [
        (b"k-other", _framed(CLASSES["Other"](x="x").SerializeToString(), [2]),
         "value: schema id 7: message index [2] is shop.Other, not the declared protobuf_message shop.Order"),
        (b"k-nested", _framed(b"", [1, 0]), "message index [1, 0] is shop.Customer.Address, not the declared"),
        (b"k-missing", _framed(good, [5]), "value: schema id 7: message index [5] is not a message of shop.proto"),
        (b"\xff\x00raw key", b"\x01" + _framed(good)[1:], "value starts with byte 0x01, not the Confluent magic byte"),
        (b"k-short", b"\x00\x00\x01", "value is 3 bytes, shorter than the Confluent header"),
        (None, truncated, "value: not a shop.Order message (truncated or corrupt)"),
        (b"k-indexes", b"\x00\x00\x00\x00\x07\x04\x02", "the Confluent message-index list is truncated"),
    ]
    _produce(bootstrap, topic_name, [(f"k{i}".encode(), v) for i, v in enumerate(values[:12])]
             + [(k, v) for k, v, _ in bad] + [(f"k{i}".encode(), v) for i, v in enumerate(values[12:], 12)])
    table = _table(mysql_kwargs)
    op = KafkaMicroBatchOperator(
        task_id="pb", pipeline_id=f"p_{topic_name}", topics=topic_name, value_format="protobuf",
        protobuf_descriptor=descriptor_file, protobuf_message="shop.Order", framing="confluent",
        on_bad_record="dead_letter", transform=FLATTEN, sink=MySqlUpsertSink(table=table, key_columns=["order_id"]),
    )
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (31, 24, 7)
    want = _sorted_attrs(_expected(payloads))
    got = _sink_rows(mysql_kwargs, table)
    assert got == want
    # the test exercises what it claims: absent messages and optionals NULL, a set-but-empty optional "", uint64 max
    assert {r[4] for r in got} >= {None, "c1"} and {r[9] for r in got} >= {None, "", "note 0"}
    assert {r[2] for r in got} >= {Decimal(0), Decimal(2**64 - 2)} and {r[3] for r in got} == set(STATUS)
    assert {r[13] is None for r in got} == {True, False} and any(r[7] != "[]" for r in got)
    found = rows(mysql_kwargs, "SELECT kafka_offset, record_key, raw_value, error, kafka_headers FROM eo_dead_letter "
                 "WHERE pipeline_id = %s ORDER BY kafka_offset", (op.pipeline_id,))
    assert {decode_headers(f[4]) for f in found} == {(("h", b"\x00\xff"),)}  # each with its headers
    dead = [(int(o), None if k is None else bytes(k), bytes(v), e) for o, k, v, e, _ in found]
    assert [d[0] for d in dead] == list(range(12, 19))
    for (offset, key, value, error), (want_key, want_value, message) in zip(dead, bad, strict=True):
        assert (key, value) == (want_key, want_value), offset
        assert message in error, (offset, error)


def test_bare_protobuf_round_trip_then_a_truncated_record_fails_the_batch(bootstrap, mysql_kwargs, topic_name,
                                                                          descriptor_file):
    """framing='none'; the first value is empty (a valid message: every field its default, the absent ones NULL);
    on_bad_record='fail'."""
    create_topic(bootstrap, topic_name, 1)
    payloads = [b"", *(_order(i) for i in range(1, 10))]
    _produce(bootstrap, topic_name, [(None, p) for p in payloads])
    table = _table(mysql_kwargs)
    op = KafkaMicroBatchOperator(
        task_id="pb", pipeline_id=f"p_{topic_name}", topics=topic_name, value_format="protobuf",
        protobuf_descriptor=descriptor_file, protobuf_message="shop.Order", framing="none", transform=FLATTEN,
        sink=MySqlUpsertSink(table=table, key_columns=["order_id"]),
    )
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"]) == (10, 10)
    want = _sorted_attrs(_expected(payloads))
    assert _sink_rows(mysql_kwargs, table) == want
    _produce(bootstrap, topic_name, [(None, _order(50)[:-3]), (None, _order(51))])
    with pytest.raises(BadRecordError, match=r"offset 10: value: not a shop.Order message \(truncated or corrupt\)"):
        run(op)
    assert _sink_rows(mysql_kwargs, table) == want
    committed = rows(mysql_kwargs, "SELECT next_offset FROM eo_offset WHERE pipeline_id = %s", (op.pipeline_id,))
    assert [int(c[0]) for c in committed] == [10]


OrderKey = CLASSES["OrderKey"]
KEYED_TABLE = ("order_id VARCHAR(20) PRIMARY KEY, amount BIGINT NOT NULL, region VARCHAR(20), shard INT, "
               "key_status VARCHAR(10), keyless BOOLEAN NOT NULL")
#: the key's fields used by the transform next to the value's: a key is a STRUCT (NULL for a record without one)
KEYED = ("SELECT order_id, amount, key.region AS region, key.shard AS shard, key.status AS key_status, "
         "key IS NULL AS keyless FROM kafka_batch")


def _order_key(i: int) -> bytes:
    return OrderKey(region=f"eu-{i % 3}" if i % 4 else "", shard=-i if i % 2 else i, status=i % 3).SerializeToString()


def _keyed_expected(records: list[tuple[bytes | None, bytes]], framed: bool) -> set[tuple]:
    """Each key and value decoded by the protobuf library directly (a framed one after its 6-byte header)."""
    out = set()
    for key, value in records:
        m = Order.FromString(value[6:] if framed else value)
        k = None if key is None else OrderKey.FromString(key[6:] if framed else key)
        out.add((m.order_id, m.amount, *((None,) * 3 if k is None else (k.region, k.shard, STATUS[k.status])),
                 k is None))
    return out


def _keyed_rows(mysql_kwargs: dict[str, Any], table: str) -> set[tuple]:
    return {(*r[:5], bool(r[5])) for r in rows(
        mysql_kwargs, f"SELECT order_id, amount, region, shard, key_status, keyless FROM {table}")}


def test_protobuf_keys_framed_and_bare_in_the_transform_a_bad_key_dead_lettered(bootstrap, mysql_kwargs,
                                                                                  descriptor_file):
    """key_format='protobuf': Confluent-framed keys (and values) with bad keys dead-lettered byte for byte, then bare
    keys (and values); the key's fields reach the sink through the transform as the protobuf library reads them.
    Then bare keys of JSON values naming the rows their tombstones delete (on_tombstone='delete')."""
    framed_topic, bare_topic, cdc_topic = (create_topic(bootstrap, f"t_{uuid.uuid4().hex[:10]}", 1) for _ in range(3))
    good = [(None if i == 5 else _framed(_order_key(i)), _framed(_order(i))) for i in range(12)]
    key = _order_key(99)
    with pytest.raises(DecodeError):  # the premise: the library itself refuses the truncated key
        OrderKey.FromString(key[:-2])
    bad = [
        (b"\x01" + _framed(key)[1:], "key starts with byte 0x01, not the Confluent magic byte 0x00"),
        (_framed(key[:-2]), "key: not a shop.OrderKey message (truncated or corrupt)"),
        (_framed(key, [1]), "key: schema id 7: message index [1] is shop.Spare, not the declared "
                            "key_protobuf_message shop.OrderKey"),
    ]
    bad_values = [_framed(_order(50 + i)) for i in range(len(bad))]
    _produce(bootstrap, framed_topic, good[:6] + [(k, v) for (k, _), v in zip(bad, bad_values, strict=True)]
             + good[6:])
    table = f"pbk_{uuid.uuid4().hex[:10]}"
    rows(mysql_kwargs, f"CREATE TABLE {table} ({KEYED_TABLE})")
    options: dict[str, Any] = dict(task_id="pbk", value_format="protobuf", protobuf_descriptor=descriptor_file,
                                   protobuf_message="shop.Order", key_format="protobuf",
                                   key_protobuf_message="shop.OrderKey", transform=KEYED,
                                   sink=MySqlUpsertSink(table=table, key_columns=["order_id"]))
    op = KafkaMicroBatchOperator(pipeline_id=f"p_{framed_topic}", topics=framed_topic, framing="confluent",
                                 on_bad_record="dead_letter", **options)
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (15, 12, 3)
    want = _keyed_expected(good, framed=True)
    assert _keyed_rows(mysql_kwargs, table) == want
    # the test exercises what it claims: a keyless record, an empty region, negative shards, every status
    assert any(w[5] for w in want) and {w[2] for w in want} >= {"", "eu-1"} and {w[3] for w in want} >= {-1, 0}
    assert {w[4] for w in want} == {None, *STATUS}
    dead = rows(mysql_kwargs, "SELECT kafka_offset, record_key, raw_value, error FROM eo_dead_letter "
                "WHERE pipeline_id = %s ORDER BY kafka_offset", (op.pipeline_id,))
    assert [int(d[0]) for d in dead] == [6, 7, 8]
    for (_, got_key, got_value, error), (want_key, message), want_value in zip(dead, bad, bad_values, strict=True):
        assert (bytes(got_key), bytes(got_value)) == (want_key, want_value)
        assert message in error, error

    bare = [(None if i == 3 else _order_key(i), _order(i)) for i in range(100, 108)]
    _produce(bootstrap, bare_topic, bare)
    rows(mysql_kwargs, f"DELETE FROM {table}")
    op = KafkaMicroBatchOperator(pipeline_id=f"p_{bare_topic}", topics=bare_topic, framing="none", **options)
    assert run(op)["rows_out"] == len(bare)
    assert _keyed_rows(mysql_kwargs, table) == _keyed_expected(bare, framed=False)

    def cdc_key(order_id: str) -> bytes:
        return OrderKey(order_id=order_id, shard=1).SerializeToString()

    _produce(bootstrap, cdc_topic, [(cdc_key(o), json.dumps({"order_id": o, "amount": n}).encode())
                                    for n, o in enumerate("abc")] + [(cdc_key("b"), None)])
    rows(mysql_kwargs, f"CREATE TABLE {table}_cdc (order_id VARCHAR(20) PRIMARY KEY, amount BIGINT)")
    op = KafkaMicroBatchOperator(
        task_id="pbk", pipeline_id=f"p_{cdc_topic}", topics=cdc_topic, schema="order_id STRING NOT NULL, amount BIGINT",
        key_format="protobuf", protobuf_descriptor=descriptor_file, key_protobuf_message="shop.OrderKey",
        framing="none", sink=MySqlUpsertSink(table=f"{table}_cdc", key_columns=["order_id"], on_tombstone="delete"))
    assert run(op)["records_in"] == 4
    assert rows(mysql_kwargs, f"SELECT order_id, amount FROM {table}_cdc ORDER BY order_id") == [("a", 0), ("c", 2)]


def test_protobuf_options_are_checked_when_the_dag_is_parsed(descriptor_file, tmp_path):
    sink = MySqlUpsertSink(table="t", key_columns=["order_id"])

    def operator(**options: Any) -> KafkaMicroBatchOperator:
        return KafkaMicroBatchOperator(task_id="pb", topics="t", value_format="protobuf", sink=sink, **options)

    with pytest.raises(ConfigurationError, match="needs protobuf_descriptor="):
        operator(protobuf_message="shop.Order", framing="none")
    with pytest.raises(ConfigurationError, match="need framing='confluent'"):
        operator(protobuf_descriptor=descriptor_file, protobuf_message="shop.Order")
    with pytest.raises(ConfigurationError, match=r"'shop.Nope' is not a message of protobuf_descriptor \(it has "
                                                 r"google.protobuf.Timestamp, shop.Customer, shop.Customer.Address, "
                                                 r"shop.Order, shop.Order.Line, shop.OrderKey, shop.Other, "
                                                 r"shop.Spare\)"):
        operator(protobuf_descriptor=descriptor_file, protobuf_message="shop.Nope", framing="none")
    (tmp_path / "junk.desc").write_bytes(b"\xff\xff\xff")
    with pytest.raises(ConfigurationError, match="is not a FileDescriptorSet"):
        operator(protobuf_descriptor=str(tmp_path / "junk.desc"), protobuf_message="shop.Order", framing="none")
    with pytest.raises(ConfigurationError, match="writer_schemas are for Avro"):
        operator(protobuf_descriptor=descriptor_file, protobuf_message="shop.Order", framing="confluent",
                 writer_schemas={1: "{}"})
    with pytest.raises(ConfigurationError, match="protobuf_message is for value_format='protobuf'"):
        KafkaMicroBatchOperator(task_id="j", topics="t", schema="a INT", protobuf_message="shop.Order", sink=sink)
    # Protobuf keys: the key's message from the same descriptor set, framed as the values
    with pytest.raises(ConfigurationError, match="key_format='protobuf' needs protobuf_descriptor= .* and "
                                                 "key_protobuf_message="):
        KafkaMicroBatchOperator(task_id="j", topics="t", schema="a INT", key_format="protobuf",
                                protobuf_descriptor=descriptor_file, framing="none", sink=sink)
    with pytest.raises(ConfigurationError, match="Avro or Protobuf keys or values need framing="):
        KafkaMicroBatchOperator(task_id="j", topics="t", schema="a INT", key_format="protobuf",
                                protobuf_descriptor=descriptor_file, key_protobuf_message="shop.OrderKey", sink=sink)
    with pytest.raises(ConfigurationError, match="key_protobuf_message='shop.Nope' is not a message of "
                                                 "protobuf_descriptor"):
        KafkaMicroBatchOperator(task_id="j", topics="t", schema="a INT", key_format="protobuf",
                                protobuf_descriptor=descriptor_file, key_protobuf_message="shop.Nope", framing="none",
                                sink=sink)
    with pytest.raises(ConfigurationError, match="key_protobuf_message is for key_format='protobuf'"):
        KafkaMicroBatchOperator(task_id="j", topics="t", schema="a INT", protobuf_descriptor=descriptor_file,
                                key_protobuf_message="shop.OrderKey", sink=sink)
    with pytest.raises(ConfigurationError, match="protobuf_descriptor is for value_format='protobuf' or key_format"):
        KafkaMicroBatchOperator(task_id="j", topics="t", schema="a INT", protobuf_descriptor=descriptor_file,
                                sink=sink)


def test_decoder_edges_without_spark():
    """What the Spark path relies on, per record: an enum number the descriptor does not name, the wrappers, a
    recursive message refused, the index-list count checked."""
    from pyspark.sql.types import LongType, StringType

    from airflow_eo.spark.protobuf import decode_one, message_class, spark_schema

    out = descriptor_pb2.FileDescriptorSet()
    wrappers_pb2.DESCRIPTOR.CopyToProto(out.file.add())
    tree = out.file.add(name="tree.proto", package="t", syntax="proto3", dependency=["google/protobuf/wrappers.proto"])
    tree.enum_type.add(name="Kind").value.add(name="ZERO", number=0)
    node = tree.message_type.add(name="Node")
    node.field.extend([_field("kind", 1, F.TYPE_ENUM, ".t.Kind"), _field("child", 2, F.TYPE_MESSAGE, ".t.Node")])
    leaf = tree.message_type.add(name="Leaf")
    leaf.field.extend([_field("kind", 1, F.TYPE_ENUM, ".t.Kind"),
                       _field("size", 2, F.TYPE_MESSAGE, ".google.protobuf.Int64Value"),
                       _field("label", 3, F.TYPE_MESSAGE, ".google.protobuf.StringValue")])
    blob = out.SerializeToString()
    with pytest.raises(ConfigurationError, match=r"'t.Node' is recursive \(t.Node -> t.Node\)"):
        spark_schema(message_class(blob, "t.Node").DESCRIPTOR)
    cls = message_class(blob, "t.Leaf")
    schema = spark_schema(cls.DESCRIPTOR)
    assert [(f.name, f.dataType) for f in schema.fields] == [("kind", StringType()), ("size", LongType()),
                                                             ("label", StringType())]
    payload = b"\x08\x07" + b"\x12\x02\x08\x05"  # kind = 7 (unnamed), size = {value: 5}, label absent
    assert decode_one(cls, payload, False, "value") == ({"kind": "7", "size": 5, "label": None}, None)
    assert decode_one(cls, b"\x00\x00\x00\x00\x01\x01" + payload, True, "value")[1] == (
        "value: schema id 1: message-index count -1 is not a count")
    assert decode_one(cls, b"\x00\x00\x00\x00\x01\x02\x02" + payload, True, "value") == (
        {"kind": "7", "size": 5, "label": None}, None)  # [1]: Leaf, the file's second message


def test_the_executor_side_decoder_imports_no_airflow(tmp_path):
    """Executors get airflow_eo as a zip on sys.path (spark/package_shipping.py) but have only pyspark, pyarrow and
    protobuf installed: decoding a batch must not import Airflow, Kafka or database clients."""
    import subprocess
    import sys

    from airflow_eo.spark.protobuf import message_class, spark_schema

    blob = descriptor_set().SerializeToString()
    (tmp_path / "set.desc").write_bytes(blob)
    (tmp_path / "schema.json").write_text(spark_schema(message_class(blob, "shop.Order").DESCRIPTOR).json())
    (tmp_path / "value.bin").write_bytes(_order(3))
    code = (
        "import sys, pathlib, pyarrow as pa\n"
        "from airflow_eo.spark.protobuf import decode_batches\n"
        "d = pathlib.Path(sys.argv[1])\n"
        "batch = pa.RecordBatch.from_pydict({'kafka_value': [(d / 'value.bin').read_bytes(), b'\\x01']})\n"
        "out = list(decode_batches((d / 'set.desc').read_bytes(), 'shop.Order', False, 'kafka_value', 'value',"
        " (d / 'schema.json').read_text(), '_eo_v', iter([batch])))\n"
        "assert out[0].column('_eo_v').to_pylist()[0]['order_id'] == 'o3', out\n"
        "assert 'truncated or corrupt' in out[0].column('_eo_v_error').to_pylist()[1], out\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('airflow', 'confluent_kafka', 'pymysql', 'psycopg')))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
