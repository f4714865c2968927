"""Bad input, fuzzed: malformed records through both bad-record policies, hostile names through the specs.

Records: truncated and invalid JSON, random bytes, invalid UTF-8 inside valid JSON, fields of the wrong
type, a missing or null required field, null values (tombstones) and null or binary keys, mixed with
good records of which some are huge (up to ~900 KB, together far more than one statement can carry).
Each record is labelled good or bad when it is generated (not by our parser). With ``dead_letter`` every
bad record is dead-lettered byte for byte and every good one is in the sink; with ``fail`` the batch
fails naming a bad record and commits nothing. The seed is printed; ``EO_FUZZ_SEED`` replays one.

Names: random table, column, key and topic names with quotes, backticks, semicolons, comments, spaces,
Unicode and NUL are refused when the spec is built (DAG parse time), or are plain identifiers; every
statement built from an accepted name quotes it and binds every value.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_eo.core.errors import BadRecordError, ConfigurationError
from airflow_eo.mysql.sql import dead_letter_ddl, upsert_statement
from airflow_eo.sinks import KafkaTransactionalSink, MySqlUpsertSink, MySqlXaSink
from examples.state import our_prepared_branches as prepared
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, rows, run

SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
HOSTILE = st.text(alphabet=st.sampled_from([*"`'\";-/*#. \t\n\\()=%,", "\x00", "é", "日", "😀", "ǅ",
                                            *"abcXYZ_019"]), max_size=70)


# --------------------------------------------------------------------------- names

@given(table=HOSTILE, key=HOSTILE, column=HOSTILE, dead_letters=HOSTILE, xa=st.booleans())
@settings(max_examples=400, deadline=None)
def test_a_hostile_name_is_refused_when_the_spec_is_built_or_is_a_plain_identifier(table, key, column,
                                                                                  dead_letters, xa):
    sink_class = MySqlXaSink if xa else MySqlUpsertSink
    names = [*table.split("."), key, column, *dead_letters.split(".")]
    try:
        spec = sink_class(table=table, key_columns=[key], updates={column: "add" if xa else "replace"},
                          dead_letter_table=dead_letters)
    except ConfigurationError as exc:
        assert "invalid" in str(exc) or "key_columns" in str(exc)
        assert not (all(SAFE_NAME.fullmatch(n) for n in names) and table.count(".") <= 1
                    and dead_letters.count(".") <= 1), f"a safe spec was refused: {exc}"
        return
    assert all(SAFE_NAME.fullmatch(n) for n in names), f"an unsafe name was accepted: {names!r}"
    columns = [key] if key == column else [key, column]
    for sql in (upsert_statement(spec.table, columns, spec.key_columns, spec.updates, 3, row_alias)
                for row_alias in (False, True)):
        # Left once every quoted name and every bound value is taken out: keywords and punctuation only.
        skeleton = re.sub(r"`[A-Za-z0-9_]+`", "N", sql).replace("%s", "V")
        assert re.fullmatch(r"[A-Z ,()=+.]+", skeleton), sql
    assert re.fullmatch(r"CREATE TABLE IF NOT EXISTS (`[A-Za-z0-9_]+`\.)?`[A-Za-z0-9_]+` \(.*",
                        dead_letter_ddl(spec.dead_letter_table))


@given(topic=HOSTILE)
@settings(max_examples=200, deadline=None)
def test_a_hostile_topic_name_is_refused_when_the_spec_is_built(topic):
    try:
        KafkaTransactionalSink(topic=topic)
    except ConfigurationError:
        assert not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic) or topic in (".", "..")
        return
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic)
    with pytest.raises(ConfigurationError, match="invalid Kafka topic"):
        operator(f"{topic};drop", MySqlUpsertSink(table="t", key_columns=["k"]))


# --------------------------------------------------------------------------- records

def good_event(rng: random.Random, huge: bool = False) -> dict[str, Any]:
    user = "é" * rng.randrange(100_000, 440_000) if huge else f"u{rng.randrange(1000)}"  # 2 bytes per é
    return {"event_id": f"e-{uuid.uuid4().hex}", "app_id": f"app_{rng.randrange(8)}", "user_id": user,
            "ts": "2026-11-23T10:00:00Z"}


def bad_value(rng: random.Random) -> bytes | None:
    text = json.dumps(good_event(rng))
    kind = rng.choice(["truncated", "random", "utf8", "ts_word", "ts_object", "no_id", "null_id", "null",
                       "not_json", "empty"])
    if kind == "truncated":
        return text[:rng.randrange(1, len(text) - 1)].encode()
    if kind == "random":
        return b"\xff" + os.urandom(rng.randrange(1, 200))  # 0xff is never valid UTF-8 nor JSON
    if kind == "utf8":  # valid JSON whose user id holds bytes that are not UTF-8
        return text.encode().replace(b': "u', b': "\xff\xfe', 1)
    if kind == "null":
        return None
    if kind == "not_json":
        return b"<event id=1/>"
    if kind == "empty":
        return b""
    event = json.loads(text)
    if kind == "ts_word":
        event["ts"] = "yesterday"
    elif kind == "ts_object":
        event["ts"] = {"at": 1}
    elif kind == "no_id":
        del event["event_id"]
    else:
        event["event_id"] = None
    return json.dumps(event).encode()


def produce(bootstrap: str, topic: str, seed: int) -> tuple[dict[str, str], dict[tuple[int, int], bytes | None]]:
    """400 records; returns the good ones (event id → user id) and the bad ones ((partition, offset) → value)."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "message.max.bytes": 1_000_000, "linger.ms": 5})
    good: dict[str, str] = {}
    bad: dict[tuple[int, int], bytes | None] = {}

    def delivered(err: Any, msg: Any, value: bytes | None) -> None:
        assert err is None, err
        bad[(msg.partition(), msg.offset())] = value

    for i in range(400):
        key = rng.choice([None, b"", os.urandom(8), b"k\x00\xff"])
        if rng.random() < 0.3:
            value = bad_value(rng)
            on_delivery = (lambda v: lambda err, msg: delivered(err, msg, v))(value)
        else:
            event = good_event(rng, huge=i % 25 == 0)
            good[event["event_id"]] = event["user_id"]
            value, on_delivery = json.dumps(event, ensure_ascii=False).encode(), None
        producer.produce(topic, value=value, key=key, partition=rng.randrange(3), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    return good, bad


@pytest.fixture(scope="module")
def fuzzed_topic(bootstrap):
    seed = int(os.environ.get("EO_FUZZ_SEED") or time.time_ns() % 1_000_000)
    print(f"fuzzed records: EO_FUZZ_SEED={seed}")
    topic = create_topic(bootstrap, f"fuzz_{uuid.uuid4().hex[:10]}", 3)
    good, bad = produce(bootstrap, topic, seed)
    return topic, good, bad, seed


def fuzz_table(mysql_kwargs: dict[str, Any]) -> str:
    name = f"fz_{uuid.uuid4().hex[:10]}"
    rows(mysql_kwargs, f"CREATE TABLE {name} (event_id VARCHAR(64) NOT NULL PRIMARY KEY, app_id VARCHAR(64) NOT NULL, "
                       "user_id MEDIUMTEXT NULL, ts DATETIME(3) NULL) ENGINE=InnoDB")
    return name


@pytest.mark.parametrize("sink_class", [MySqlXaSink, MySqlUpsertSink])
def test_every_fuzzed_bad_record_is_dead_lettered_byte_for_byte_and_every_good_one_written(
        sink_class, fuzzed_topic, mysql_kwargs):
    topic, good, bad, seed = fuzzed_topic
    table = fuzz_table(mysql_kwargs)
    op = operator(topic, sink_class(table=table, key_columns=["event_id"]), on_bad_record="dead_letter",
                  pipeline_id=f"p_{table}")
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (
        len(good) + len(bad), len(good), len(bad)), f"seed {seed}"
    written = dict(rows(mysql_kwargs, f"SELECT event_id, user_id FROM {table}"))
    assert written == good, f"seed {seed}: the sink differs from the good records (huge ones included)"
    dead = {(p, o): (None if v is None else bytes(v)) for p, o, v in rows(
        mysql_kwargs, "SELECT kafka_partition, kafka_offset, raw_value FROM eo_dead_letter WHERE pipeline_id = %s",
        (op.pipeline_id,))}
    assert dead == bad, f"seed {seed}: dead letters differ from the bad records"
    assert prepared(mysql_kwargs, op.pipeline_id) == []


@pytest.mark.parametrize("sink_class", [MySqlXaSink, MySqlUpsertSink])
def test_a_fuzzed_bad_record_under_fail_commits_nothing(sink_class, fuzzed_topic, mysql_kwargs):
    topic, _, bad, seed = fuzzed_topic
    table = fuzz_table(mysql_kwargs)
    op = operator(topic, sink_class(table=table, key_columns=["event_id"]), pipeline_id=f"p_{table}")
    first = min(bad, key=lambda k: (k[0], k[1]))  # the error names the first bad record in partition order
    with pytest.raises(BadRecordError, match=rf"{topic}\[{first[0]}\] offset {first[1]}: .*Nothing was committed"):
        run(op)
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}")[0][0] == 0, f"seed {seed}"
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM eo_offset WHERE pipeline_id = %s", (op.pipeline_id,))[0][0] == 0
    assert prepared(mysql_kwargs, op.pipeline_id) == []
