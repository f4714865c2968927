"""Values a sink's table cannot store are bad records, not a batch that fails on every run: under
``on_bad_record="dead_letter"`` they become dead letters naming the column and the good records around them commit;
under ``"fail"`` the batch fails naming the topic, partition, offset and column, and commits nothing. Real Kafka,
Spark, MariaDB and PostgreSQL, every SQL sink kind, MySQL's bulk and statement paths.

Refused here: a string longer than its ``VARCHAR(n)``, ``NULL`` for a ``NOT NULL`` column, an integer outside an
``INTEGER`` column (the record's field is a ``BIGINT``), a NUL character in PostgreSQL text, more bytes than MySQL's
``TEXT`` holds. The same values are stored where the database takes them (NUL on MySQL, long text on PostgreSQL)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from airflow_eo.core.errors import BadRecordError
from airflow_eo.hooks.sinks import build_sink
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink, PostgresTwoPhaseSink, PostgresUpsertSink
from tests.integration.operator_harness import operator, rows, run
from tests.support.kafka import create_topic, produce_json
from tests.support.postgres import MYSQL_STORE, pg_rows

SCHEMA = "id STRING NOT NULL, name STRING, n BIGINT, note STRING"
DDL = ("CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, name VARCHAR(8) NOT NULL, n INTEGER NULL, "
       "note TEXT NULL)")

SINKS = {
    "mysql-upsert": (MySqlUpsertSink, {}),
    "mysql-upsert-statements": (MySqlUpsertSink, {"bulk_load": False}),
    "mysql-xa": (MySqlXaSink, {}),
    "postgres-upsert": (PostgresUpsertSink, {}),
    "postgres-two-phase": (PostgresTwoPhaseSink, {}),
}

#: (event, the column a database refuses it for: {"mysql": .., "postgres": ..}; absent: stored)
CASES: list[tuple[dict[str, Any], dict[str, str]]] = [
    ({"id": "long-name", "name": "ninechars", "n": 1, "note": None}, {"mysql": "name", "postgres": "name"}),
    ({"id": "no-name", "name": None, "n": 2, "note": None}, {"mysql": "name", "postgres": "name"}),
    ({"id": "big-n", "name": "b", "n": 2**31, "note": None}, {"mysql": "n", "postgres": "n"}),
    ({"id": "small-n", "name": "s", "n": -2**31 - 1, "note": None}, {"mysql": "n", "postgres": "n"}),
    ({"id": "id-of-seventeen-c", "name": "i", "n": 3, "note": None}, {"mysql": "id", "postgres": "id"}),
    ({"id": "nul", "name": "a\u0000b", "n": 4, "note": "x\u0000y"}, {"postgres": "name"}),
    ({"id": "long-text", "name": "t", "n": 5, "note": "é" * 40000}, {"mysql": "note"}),  # 80,000 bytes
    ({"id": "edge", "name": "8 chars.", "n": 2**31 - 1, "note": "ok"}, {}),  # at the limits: stored
]


def events() -> list[dict[str, Any]]:
    good = [{"id": f"good-{i:02d}", "name": f"n{i}", "n": i, "note": f"note {i}"} for i in range(20)]
    return good[:10] + [event for event, _ in CASES] + good[10:]


@pytest.mark.parametrize("kind", SINKS)
def test_values_the_table_refuses_become_dead_letters_and_the_rest_commits(kind, bootstrap, mysql_kwargs,
                                                                          postgres_kwargs, topic_name):
    database = kind.split("-")[0]
    spec_class, options = SINKS[kind]
    table = f"refused_{uuid.uuid4().hex[:8]}"
    query = (lambda sql: rows(mysql_kwargs, sql)) if database == "mysql" else (
        lambda sql: pg_rows(postgres_kwargs, sql))
    query(DDL.format(table=table) + (" DEFAULT CHARSET=utf8mb4" if database == "mysql" else ""))
    create_topic(bootstrap, topic_name, 1)
    produced = events()
    produce_json(bootstrap, topic_name, produced)
    spec = spec_class(table=table, key_columns=["id"], **options)

    with pytest.raises(BadRecordError, match=rf"{topic_name}\[0\] offset 10: column 'name' of table {table} is "
                                             r"(varchar\(8\)|character varying\(8\)): the value is longer than 8"):
        run(operator(topic_name, spec, pipeline_id=f"fail_{topic_name}", schema=SCHEMA))
    assert query(f"SELECT COUNT(*) FROM {table}")[0][0] == 0

    op = operator(topic_name, spec, pipeline_id=f"dead_{topic_name}", schema=SCHEMA, on_bad_record="dead_letter")
    summary = run(op)
    refused = {e["id"]: columns[database] for e, columns in CASES if database in columns}
    assert (summary["records_in"], summary["dead_letters"]) == (len(produced), len(refused))
    stored = {r[0]: tuple(r[1:]) for r in query(f"SELECT id, name, n, note FROM {table}")}
    assert stored == {e["id"]: (e["name"], e["n"], e["note"]) for e in produced if e["id"] not in refused}
    dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 50)  # type: ignore[attr-defined]
    assert {json.loads(bytes(d["raw_value"]))["id"]: d["error"] for d in dead}.keys() == refused.keys()
    for d in dead:
        column = refused[json.loads(bytes(d["raw_value"]))["id"]]
        assert f"column {column!r} of table {table}" in d["error"], d["error"]
