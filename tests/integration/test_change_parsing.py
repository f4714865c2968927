"""Debezium change events parsed by ``changes="debezium"`` (``spark/changes.py``), on real events a real Debezium
wrote (``tests/fixtures/debezium``, recorded by ``scripts/record_debezium_events.py``): rows, deletes, skipped records,
errors and positions, with and without the JSON converter's schema wrapper. The end-to-end tests run the real
Debezium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_eo.core.changes import CHANGE_OP, POSITION_COLUMN, postgres_position
from airflow_eo.core.config import DELETE_COLUMN, ParseConfig
from tests.support.kafka_frames import kafka_frame

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "debezium"
ROW = "id INT, name STRING, qty INT"
CASES = ("read", "create", "update", "delete", "primary_key_change", "transaction", "default_identity", "heartbeat",
         "truncate")


def _records(shape: str) -> list[dict[str, Any]]:
    records = []
    for case in CASES:
        records += json.loads((FIXTURES / shape / f"{case}.json").read_text())["records"]
    return records


def _raw(spark: Any, records: list[dict[str, Any]]) -> Any:
    def raw(value: Any) -> bytes | None:
        return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    return kafka_frame(spark, records, [raw(r["key"]) for r in records], [raw(r["value"]) for r in records])


@pytest.mark.parametrize("shape", ["with_schema", "without_schema"])
def test_real_debezium_events_become_rows_deletes_and_positions(shape):
    from airflow_eo.spark.changes import SKIP
    from airflow_eo.spark.parsing import parse_records
    from airflow_eo.spark.session import get_session

    spark = get_session()
    records = _records(shape)
    parse = ParseConfig("json", ROW, changes="debezium", change_keys=("id",))
    parsed, payload = parse_records(spark, _raw(spark, records), parse)
    assert payload == ["id", "name", "qty", DELETE_COLUMN]
    got = parsed.orderBy("kafka_topic", "kafka_offset").collect()
    by_place = {(r["kafka_topic"], r["kafka_offset"]): r for r in got}
    assert len(got) == len(records)
    for record in records:
        row = by_place[(record["topic"], record["offset"])]
        value = record["value"]
        envelope = value.get("payload", value) if isinstance(value, dict) else None
        op = envelope.get("op") if envelope else None
        if value is None or op is None:  # a tombstone, a heartbeat, a transaction's BEGIN / END
            assert row[SKIP] and row["_eo_error"] is None, (record, row)
            continue
        assert not row[SKIP] and row[CHANGE_OP] == op
        if op == "t":
            assert "truncate" in row["_eo_error"]
            continue
        assert row["_eo_error"] is None, (record, row)
        image = envelope["before"] if op == "d" else envelope["after"]
        assert (row["id"], row[DELETE_COLUMN]) == (image["id"], op == "d")
        if op != "d":
            assert (row["name"], row["qty"]) == (image["name"], image["qty"])
        source = envelope["source"]
        assert bytes(row[POSITION_COLUMN]) == postgres_position(op, source["lsn"], source["sequence"])
    # Source order: of the changes of key 4 (one transaction), the update is after the create.
    four = [by_place[(r["topic"], r["offset"])] for r in records
            if r["value"] and ((r["key"] or {}).get("payload") or r["key"] or {}).get("id") == 4]
    assert [r[CHANGE_OP] for r in sorted(four, key=lambda r: bytes(r[POSITION_COLUMN]))] == ["c", "u"]


def test_a_value_that_is_no_change_event_is_a_bad_record_saying_so():
    from airflow_eo.spark.parsing import parse_records
    from airflow_eo.spark.session import get_session

    spark = get_session()
    records = [{"topic": "t", "partition": 0, "offset": 0, "key": {"id": 1}, "value": {"id": 1, "name": "x"}},
               {"topic": "t", "partition": 0, "offset": 1, "key": {"id": 2},
                "value": {"op": "c", "after": {"id": None, "name": "y", "qty": 1},
                          "source": {"lsn": 5, "sequence": "[null,\"5\"]"}}},
               {"topic": "t", "partition": 0, "offset": 2, "key": {"id": 3},
                "value": {"op": "d", "before": None, "source": {"lsn": 6}}}]
    parse = ParseConfig("json", ROW, changes="debezium", change_keys=("id",))
    parsed, _ = parse_records(spark, _raw(spark, records), parse)
    errors = [r["_eo_error"] for r in parsed.orderBy("kafka_offset").collect()]
    assert "not a Debezium change event" in errors[0]
    assert errors[1] == "change without its key column 'id'"
    assert "delete without its 'before' image" in errors[2]


def test_a_change_with_an_unpaired_surrogate_escape_is_a_bad_record():
    """JSON's reader makes an unpaired ``\\ud800`` a ``?``: the row would not hold what the source wrote."""
    from airflow_eo.spark.parsing import parse_records
    from airflow_eo.spark.session import get_session

    spark = get_session()
    change = ('{{"op":"c","after":{{"id":{id},"name":"{name}","qty":1}},'
              '"source":{{"lsn":{id},"sequence":"[null,\\"{id}\\"]"}}}}')
    names = ["a\\ud800b", "a\\ud83d\\ude00b", "a\\\\ud800b"]  # lone; a pair (an emoji); an escaped backslash
    records = [{"topic": "t", "partition": 0, "offset": n} for n in range(len(names))]
    values = [change.format(id=n + 1, name=name).encode() for n, name in enumerate(names)]
    parse = ParseConfig("json", ROW, changes="debezium", change_keys=("id",))
    parsed, _ = parse_records(spark, kafka_frame(spark, records, [None] * len(names), values), parse)
    found = [(r["_eo_error"], r["name"]) for r in parsed.orderBy("kafka_offset").collect()]
    assert "unpaired UTF-16 surrogate escape" in found[0][0]
    assert found[1:] == [(None, "a\U0001f600b"), (None, "a\\ud800b")]


def test_an_integer_keys_id_is_the_hash_of_the_same_json_text_as_to_json_writes():
    """Stored key ids were hashed from ``to_json``'s text: the faster spelling must give the same (a key with a NULL
    has no id)."""
    from pyspark.sql import functions as F

    from airflow_eo.spark.changes import _key_json
    from airflow_eo.spark.session import get_session

    spark = get_session()

    df = spark.createDataFrame([(1, -7, "a\"b"), (-2147483648, 9223372036854775807, "é"), (None, 3, None)],
                               "id INT, seq BIGINT, name STRING")
    for keys in (["id"], ["id", "seq"], ["name"], ["seq", "name"]):
        known = df.where(" AND ".join(f"{k} IS NOT NULL" for k in keys))
        compared = known.select(_key_json(df, keys).alias("ours"),
                                F.to_json(F.struct(*[F.col(k) for k in keys])).alias("json")).collect()
        assert compared and [r["ours"] for r in compared] == [r["json"] for r in compared], keys
