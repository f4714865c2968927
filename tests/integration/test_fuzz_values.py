"""Hypothesis-generated values through both databases' sinks (real Kafka, Spark, MariaDB, PostgreSQL): any text
(NUL, every plane of Unicode, longer than the column), any integer (beyond the column, beyond 64 bits). Nothing is
lost and nothing stalls: the batch commits, each record is either its row, equal to what was produced, or a dead
letter, as the table's own limits say (the oracle below knows them from the DDL and Python's codecs, not from the
code under test). MySQL's tables in three character sets: utf8mb4, utf8mb3 (no emoji) and latin1 (Windows-1252).

Surrogates too: Python's ``json.dumps`` escapes each (``"\\ud800"``); a high one before a low one is their pair's
character to every JSON reader, an unpaired one a bad record (Spark's reader would store ``?``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.sinks import MySqlUpsertSink, PostgresUpsertSink
from tests.support.kafka import create_topic, produce_json
from tests.support.operator_harness import operator, rows, run
from tests.support.postgres import pg_rows
from tests.support.stores import MYSQL_STORE

#: Texts whose JSON (Python's ``json.dumps``) puts an escaped backslash next to surrogate escapes: ``"\\ud800\udc00"``
#: is an escaped backslash, the text ``ud800`` and an unpaired low surrogate, never a pair.
SURROGATE_TEXTS = ["\\ud800\udc00", "\ud800\\\udc00", "\\\ud800\udc00", "\\\\ud83d\ude00", "\\udbff\udfff!"]
SCHEMA = "id STRING NOT NULL, s STRING, n BIGINT"
DDL = "CREATE TABLE {table} (id VARCHAR(40) NOT NULL PRIMARY KEY, s VARCHAR(32) NULL, n INTEGER NULL)"
TEXT = (st.text(st.characters(exclude_categories=("Cs",)), max_size=40) | st.text("\x00ab", max_size=5)
        | st.text("\ud800\udc00\\u", max_size=6) | st.sampled_from(SURROGATE_TEXTS))
INTEGERS = st.integers(min_value=-(2**31) - 5, max_value=2**31 + 5) | st.integers(min_value=-(2**70),
                                                                                   max_value=2**70)
RECORDS = st.lists(st.fixed_dictionaries({"s": st.none() | TEXT, "n": st.none() | INTEGERS}), min_size=60,
                   max_size=120)


#: The tables' character sets (MySQL; PostgreSQL's database is UTF-8) and whether a character is in one.
CHARSETS = {"utf8mb4": lambda c: True, "utf8mb3": lambda c: ord(c) <= 0xFFFF, "latin1": lambda c: _cp1252(c)}


def _cp1252(c: str) -> bool:
    """MySQL's latin1: Windows-1252, its five unassigned bytes holding the C1 controls of the same number."""
    if ord(c) in (0x81, 0x8D, 0x8F, 0x90, 0x9D):
        return True
    try:
        c.encode("cp1252")
    except UnicodeEncodeError:
        return False
    return True


def as_read(record: dict[str, Any]) -> dict[str, Any]:
    """The record as a JSON reader gets it from the topic (a surrogate pair joined into its character)."""
    return json.loads(json.dumps(record))


def storable(record: dict[str, Any], target: str) -> bool:
    """What the table takes: VARCHAR(32) (characters) of its character set, INTEGER, no NUL in PostgreSQL text, no
    unpaired surrogate (no text holds one)."""
    s, n = as_read(record)["s"], record["n"]
    if s is not None and any(0xD800 <= ord(c) <= 0xDFFF for c in s):
        return False
    if s is not None and (len(s) > 32 or (target == "postgres" and "\x00" in s)):
        return False
    if s is not None and target != "postgres" and not all(CHARSETS[target.split("-")[1]](c) for c in s):
        return False
    return n is None or -(2**31) <= n <= 2**31 - 1


@pytest.mark.parametrize("target", ["mysql-utf8mb4", "mysql-utf8mb3", "mysql-latin1", "postgres"])
def test_generated_values_are_stored_as_produced_or_dead_lettered(target, bootstrap, mysql_kwargs, postgres_kwargs):
    database = target.split("-")[0]

    # Each example is a batch through Kafka, Spark and the database (~5 s): a few, large, and no shrinking.
    @settings(max_examples=2, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate),
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(RECORDS)
    def check(records: list[dict[str, Any]]) -> None:
        table, topic = f"fuzz_{uuid.uuid4().hex[:8]}", f"fuzz_{uuid.uuid4().hex[:8]}"
        query = (lambda sql: rows(mysql_kwargs, sql)) if database == "mysql" else (
            lambda sql: pg_rows(postgres_kwargs, sql))
        query(DDL.format(table=table) + (f" DEFAULT CHARSET={target.split('-')[1]}" if database == "mysql" else ""))
        create_topic(bootstrap, topic, 2)
        produced = [{"id": uuid.uuid4().hex, **r} for r in records]
        produce_json(bootstrap, topic, produced)
        spec = (MySqlUpsertSink if database == "mysql" else PostgresUpsertSink)(table=table, key_columns=["id"])
        op = operator(topic, spec, pipeline_id=f"fuzz_{topic}", schema=SCHEMA, on_bad_record="dead_letter")
        summary = run(op)

        stored = {r[0]: (r[1], r[2]) for r in query(f"SELECT id, s, n FROM {table}")}
        dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 100)  # type: ignore[attr-defined]
        dead_ids = {json.loads(bytes(d["raw_value"]))["id"] for d in dead}
        assert stored.keys() | dead_ids == {r["id"] for r in produced} and not stored.keys() & dead_ids
        for record in produced:
            if storable(record, target):
                assert stored.get(record["id"]) == (as_read(record)["s"], record["n"]), record
            else:
                assert record["id"] in dead_ids, record
        assert summary["dead_letters"] == len(dead_ids)

    check()
