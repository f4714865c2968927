"""The dead-letter tables' ``kafka_headers`` encoding (``airflow_eo.core.headers``) and the columns the dead-letter
tables of both databases gain after their first version."""

from __future__ import annotations

import json

import pytest

from airflow_eo.core.batch import DEAD_LETTER_FIELDS
from airflow_eo.core.headers import NO_HEADERS, decode_headers, encode_header_structs, encode_headers
from airflow_eo.mysql import sql as mysql_sql
from airflow_eo.postgres import sql as postgres_sql

EDGES = [
    ("source", b"app"), ("trace", bytes(range(256))), ("source", b"again"),  # every byte; a duplicate key
    ("null", None), ("empty", b""),  # a null value is not an empty one
    ("cl\u00e9 \U0001f600", b"\xff"), ("nul\x00key", b"\x00"), ("lone\ud800", b"x"),  # any text of a key
]


def test_headers_round_trip_byte_for_byte_in_order_as_ascii_json():
    text = encode_headers(EDGES)
    assert text.isascii()  # no column charset or collation can alter it
    assert decode_headers(text) == tuple(EDGES)
    assert json.loads(text)[0] == {"key": "source", "value": "YXBw"}  # base64, readable by SQL's decoders
    assert json.loads(text)[3] == {"key": "null", "value": None}


def test_no_headers_is_an_empty_list_and_null_is_not_kept():
    assert encode_headers(None) == encode_headers([]) == NO_HEADERS == "[]"
    assert decode_headers("[]") == ()
    assert decode_headers(None) is None  # a row written before the column existed


def test_spark_structs_encode_as_pairs():
    structs = [{"key": k, "value": None if v is None else bytearray(v)} for k, v in EDGES]
    assert encode_header_structs(structs) == encode_headers(EDGES)
    assert encode_header_structs(None) == "[]"


@pytest.mark.parametrize("text", ["{}", "[1]", '[{"key": "k"}]', '[{"key": "k", "value": "***"}]', "not json"])
def test_what_is_not_a_headers_value_is_refused(text):
    with pytest.raises(ValueError, match="not a kafka_headers value"):
        decode_headers(text)


@pytest.mark.parametrize("room", [mysql_sql, postgres_sql])
def test_dead_letter_tables_get_every_field_and_older_tables_only_what_they_lack(room):
    ddl = room.dead_letter_ddl("dl")
    assert all(field in ddl for field in DEAD_LETTER_FIELDS if field not in ("pipeline_id",))
    versions = [version for version, _, _ in room.DEAD_LETTER_MIGRATIONS]
    assert versions == sorted(set(versions)) and versions[0] == 2  # append only, after the first version
    v1 = ["pipeline_id", "topic", "kafka_partition", "kafka_offset", "batch_id", "record_key", "raw_value", "error",
          "created_at"]
    [(column, statement)] = room.dead_letter_upgrades("dl", v1)
    assert column == "kafka_headers"
    assert "ADD COLUMN" in statement and "kafka_headers" in statement
    assert room.dead_letter_upgrades("dl", [*v1, "kafka_headers"]) == []  # up to date: nothing to run
