"""Values a sink's table cannot store are bad records, not a batch that fails on every run: under
``on_bad_record="dead_letter"`` they become dead letters naming the column and the good records around them commit;
under ``"fail"`` the batch fails naming the topic, partition, offset and column, and commits nothing. Real Kafka,
Spark, MariaDB and PostgreSQL, every SQL sink kind, MySQL's bulk and statement paths.

Refused here: a string longer than its ``VARCHAR(n)``, ``NULL`` for a ``NOT NULL`` column, an integer outside an
``INTEGER`` column (the record's field is a ``BIGINT``), a NUL character in PostgreSQL text, more bytes than MySQL's
``TEXT`` holds. The same values are stored where the database takes them (NUL on MySQL, long text on PostgreSQL).

Refused only when written (no catalog rule can tell them: the write fails, probes find the records): a ``CHECK``
constraint, a foreign key, a trigger that raises, a ``DECIMAL`` out of its precision."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Producer

from airflow_eo.core.errors import BadRecordError, UnavailableError
from airflow_eo.core.refused_rows import ROW_LOCK_WAIT_S
from airflow_eo.core.xid import pipeline_key
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink, PostgresTwoPhaseSink, PostgresUpsertSink
from tests.support.kafka import create_topic, produce_json
from tests.support.operator_harness import operator, rows, run
from tests.support.postgres import pg_rows
from tests.support.stores import MYSQL_STORE

SCHEMA = "id STRING NOT NULL, name STRING, n BIGINT, note STRING, parent STRING, price DECIMAL(10,2)"
DDL = ("CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, name VARCHAR(8) NOT NULL, n INTEGER NULL, "
       "note TEXT NULL, parent VARCHAR(8) NULL, price DECIMAL(5,2) NULL, "
       "CONSTRAINT {table}_n_not_666 CHECK (n IS NULL OR n <> 666), "
       "FOREIGN KEY (parent) REFERENCES {table}_parents (code))")
PARENTS = "CREATE TABLE {table}_parents (code VARCHAR(8) NOT NULL PRIMARY KEY)"
TRIGGER = {
    "mysql": ["CREATE TRIGGER {table}_refuse BEFORE INSERT ON {table} FOR EACH ROW BEGIN IF NEW.name = 'forbid' "
              "THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the name forbid is refused'; END IF; END"],
    "postgres": ["CREATE FUNCTION {table}_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.name = "
                 "'forbid' THEN RAISE EXCEPTION 'the name forbid is refused'; END IF; RETURN NEW; END $$",
                 "CREATE TRIGGER {table}_refuse BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW "
                 "EXECUTE FUNCTION {table}_refuse()"],
}

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
    # VARCHAR(n) counts characters: 8 of two bytes each are stored, 9 are refused.
    ({"id": "wide-8", "name": "é" * 8, "n": 9, "note": None}, {}),
    ({"id": "wide-9", "name": "é" * 9, "n": 10, "note": None}, {"mysql": "name", "postgres": "name"}),
]


#: (event, what the database's error for it names); all refused on both databases, found only by the write
WRITE_CASES: list[tuple[dict[str, Any], str]] = [
    ({"id": "check", "name": "c", "n": 666, "note": None}, "n_not_666"),
    ({"id": "orphan", "name": "o", "n": 6, "note": None, "parent": "nobody"}, "parent"),
    ({"id": "trigger", "name": "forbid", "n": 7, "note": None}, "the name forbid is refused"),
    ({"id": "price", "name": "p", "n": 8, "note": None, "price": 1234.5}, "price"),
]


def events() -> list[dict[str, Any]]:
    good = [{"id": f"good-{i:02d}", "name": f"n{i}", "n": i, "note": f"note {i}"} for i in range(20)]
    return good[:10] + [event for event, _ in CASES] + good[10:]


def written_late() -> list[dict[str, Any]]:
    """Refused by the table only at the write, among good records (one with a parent, one with a price)."""
    good = [{"id": f"late-{i:02d}", "name": f"l{i}", "n": 100 + i, "note": None} for i in range(12)]
    good[3].update(parent="p1")
    good[4].update(price=999.99)
    return good[:5] + [event for event, _ in WRITE_CASES] + good[5:]


def _stored(event: dict[str, Any]) -> tuple:
    price = event.get("price")
    return event["name"], event["n"], event["note"], event.get("parent"), None if price is None else Decimal(str(price))


def _setup(kind: str, mysql_kwargs: dict[str, Any], postgres_kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """(database, spec class, its options, a fresh table name, a statement runner on that database)."""
    database = kind.split("-")[0]
    spec_class, options = SINKS[kind]
    query = (lambda sql: rows(mysql_kwargs, sql)) if database == "mysql" else (
        lambda sql: pg_rows(postgres_kwargs, sql))
    return database, spec_class, options, f"refused_{uuid.uuid4().hex[:8]}", query


@pytest.mark.parametrize("kind", SINKS)
def test_values_the_table_refuses_become_dead_letters_and_the_rest_commits(kind, bootstrap, mysql_kwargs,
                                                                          postgres_kwargs, topic_name):
    database, spec_class, options, table, query = _setup(kind, mysql_kwargs, postgres_kwargs)
    query(PARENTS.format(table=table) + (" DEFAULT CHARSET=utf8mb4" if database == "mysql" else ""))
    query(f"INSERT INTO {table}_parents VALUES ('p1')")
    query(DDL.format(table=table) + (" DEFAULT CHARSET=utf8mb4" if database == "mysql" else ""))
    for statement in TRIGGER[database]:
        query(statement.format(table=table))
    create_topic(bootstrap, topic_name, 1)
    produced = events()
    produce_json(bootstrap, topic_name, produced)
    spec = spec_class(table=table, key_columns=["id"], **options)

    with pytest.raises(BadRecordError, match=rf"{topic_name}\[0\] offset 10: column 'name' of table {table} is "
                                             r"(varchar\(8\)|character varying\(8\)): the value is longer than 8"):
        run(operator(topic_name, spec, pipeline_id=f"fail_{topic_name}", schema=SCHEMA))
    assert query(f"SELECT COUNT(*) FROM {table}")[0][0] == 0

    late = written_late()  # after the failed run: its batch above ends before them
    produce_json(bootstrap, topic_name, late)
    produced += late
    op = operator(topic_name, spec, pipeline_id=f"dead_{topic_name}", schema=SCHEMA, on_bad_record="dead_letter")
    summary = run(op)
    refused = {e["id"]: columns[database] for e, columns in CASES if database in columns}
    at_write = {e["id"]: named for e, named in WRITE_CASES}
    assert (summary["records_in"], summary["dead_letters"]) == (len(produced), len(refused) + len(at_write))
    stored = {r[0]: tuple(r[1:]) for r in query(f"SELECT id, name, n, note, parent, price FROM {table}")}
    assert stored == {e["id"]: _stored(e) for e in produced if e["id"] not in refused and e["id"] not in at_write}
    dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 50)  # type: ignore[attr-defined]
    errors = {json.loads(bytes(d["raw_value"]))["id"]: d["error"] for d in dead}
    assert errors.keys() == refused.keys() | at_write.keys()
    for key, column in refused.items():
        assert f"column {column!r} of table {table}" in errors[key], errors[key]
    for key, named in at_write.items():
        assert errors[key].startswith(f"table {table} refused it: ") and named in errors[key], errors[key]


@pytest.mark.parametrize("kind", ["mysql-xa", "postgres-upsert"])  # a one-pass write, and the upsert's vote
def test_a_row_refused_at_the_write_fails_the_batch_naming_its_record_under_fail(kind, bootstrap, mysql_kwargs,
                                                                                  postgres_kwargs, topic_name):
    database, spec_class, options, table, query = _setup(kind, mysql_kwargs, postgres_kwargs)
    query(f"CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, n INTEGER NULL, "
          f"CONSTRAINT {table}_small CHECK (n < 100))")
    create_topic(bootstrap, topic_name, 1)
    produce_json(bootstrap, topic_name, [{"id": f"e{i}", "n": 100 if i == 3 else i} for i in range(6)])
    spec = spec_class(table=table, key_columns=["id"], **options)

    with pytest.raises(BadRecordError, match=rf"table {table} refused 1 record\(s\) of this batch; the first: "
                                             rf"{topic_name}\[0\] offset 3: .*{table}_small"):
        run(operator(topic_name, spec, pipeline_id=f"fail_{topic_name}", schema="id STRING, n BIGINT"))
    assert rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s", (f"fail_{topic_name}",)) == [
        ("planned",)], "the batch must not pass its commit point"
    stored = {r[0] for r in query(f"SELECT id FROM {table}")}
    if kind == "postgres-upsert":
        # The upsert's vote is on bad records, cast while the rows are written: a task whose write the table refuses
        # has voted already, so the other task's rows (upserts, visible before the commit point, written the same by
        # the next attempt) may show. The refused record's never does.
        assert "e3" not in stored and stored <= {f"e{i}" for i in range(6)}
    else:
        assert stored == set()  # prepared branches, rolled back
    if database == "mysql":  # a transform's row is no one record: the batch fails saying so
        with pytest.raises(BadRecordError, match=rf"table {table} refused a row of the transform's output"):
            run(operator(topic_name, spec, pipeline_id=f"transformed_{topic_name}", schema="id STRING, n BIGINT",
                         transform="SELECT id, n * 50 AS n FROM kafka_batch"))
        assert query(f"SELECT COUNT(*) FROM {table}")[0][0] == 0


def test_a_row_of_a_transforms_output_refused_makes_the_batchs_records_dead_letters(bootstrap, mysql_kwargs,
                                                                                     topic_name):
    """No record can be blamed alone for a transformed row, so under ``dead_letter`` the batch's records become dead
    letters, byte for byte, and the pipeline goes on. Before, the batch failed on every run: a producer stalled it."""
    table = f"refused_{uuid.uuid4().hex[:8]}"
    rows(mysql_kwargs, f"CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, n INTEGER NULL, "
                       f"CONSTRAINT {table}_small CHECK (n < 100))")
    create_topic(bootstrap, topic_name, 1)
    produce_json(bootstrap, topic_name, [{"id": f"e{i}", "n": i} for i in range(5)])
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic_name, b"{not json")  # offset 5: a bad record before the write
    assert producer.flush(30) == 0
    spec = MySqlXaSink(table=table, key_columns=["id"])
    op = operator(topic_name, spec, pipeline_id=f"transformed_{topic_name}", schema="id STRING, n BIGINT",
                  on_bad_record="dead_letter", transform="SELECT id, n * 30 AS n FROM kafka_batch")  # e4: 120
    summary = run(op)
    assert (summary["records_in"], summary["dead_letters"]) == (6, 6)
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}") == [(0,)]
    dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 10)  # type: ignore[attr-defined]
    assert sorted(d["kafka_offset"] for d in dead) == list(range(6))
    for letter in dead:
        if letter["kafka_offset"] == 5:  # a bad record before the write keeps its own error
            assert "refused" not in letter["error"], letter["error"]
            continue
        assert json.loads(bytes(letter["raw_value"]))["id"] == f"e{letter['kafka_offset']}"
        assert letter["error"].startswith(f"table {table} refused a row of the transform's output: ") and \
            f"{table}_small" in letter["error"] and "every record of its batch" in letter["error"], letter["error"]
    produce_json(bootstrap, topic_name, [{"id": "e9", "n": 1}])  # the next batch goes on
    assert run(op)["rows_out"] == 1 and rows(mysql_kwargs, f"SELECT id, n FROM {table}") == [("e9", 30)]


def test_a_row_refused_where_the_write_tasks_mark_copies_is_found_and_its_copies_still_dropped(
        bootstrap, mysql_kwargs, topic_name):
    """``dedup_key`` on the table's key: the write tasks mark the copies themselves; when the table refuses a row
    there, the copies are marked by a job of their own and the refused record found against the marked batch."""
    from tests.support.seen_ids import seen_rows

    table = f"refused_{uuid.uuid4().hex[:8]}"
    rows(mysql_kwargs, f"CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, n INTEGER NULL, "
                       f"CONSTRAINT {table}_small CHECK (n < 100))")
    create_topic(bootstrap, topic_name, 1)
    produce_json(bootstrap, topic_name, [{"id": f"e{i}", "n": 100 if i == 3 else i} for i in range(6)] +
                 [{"id": "e1", "n": 1}, {"id": "e3", "n": 100}])  # re-sent: copies of e1 and of the refused e3
    spec = MySqlXaSink(table=table, key_columns=["id"])
    pipeline = f"dedup_{topic_name}"
    summary = run(operator(topic_name, spec, pipeline_id=pipeline, schema="id STRING, n BIGINT",
                           on_bad_record="dead_letter", dedup_key=["id"]))
    assert (summary["records_in"], summary["dead_letters"], summary["duplicates"]) == (8, 1, 2)
    assert "dedup_mark" in summary["seconds"], "the batch was marked again by a job of its own"
    assert sorted(r[0] for r in rows(mysql_kwargs, f"SELECT id FROM {table}")) == ["e0", "e1", "e2", "e4", "e5"]
    adapter = build_sink(spec, pipeline, MYSQL_STORE)
    dead = adapter.dead_letters(pipeline, None, 10)  # type: ignore[attr-defined]
    assert [(d["kafka_offset"], f"{table}_small" in d["error"]) for d in dead] == [(3, True)]
    seen = seen_rows(adapter.database, adapter.connect_kwargs, pipeline)  # type: ignore[attr-defined]
    assert sorted(r["kafka_offset"] for r in seen) == [0, 1, 2, 3, 4, 5]  # the refused event counts as seen


@pytest.mark.parametrize("kind", ["postgres-two-phase", "postgres-upsert"])
def test_of_records_sharing_a_value_of_a_unique_index_the_later_becomes_a_dead_letter(kind, bootstrap, mysql_kwargs,
                                                                                     postgres_kwargs, topic_name):
    """Two records with one value of a unique index other than the key: each is taken alone, so no probe of one
    record finds them; the later (by offset) is refused as the database refuses the later of two inserts, the batch
    commits the rest. Before, the batch failed on every run ("refused only together"): a producer stalled it.
    (MySQL's ``INSERT .. ON DUPLICATE KEY UPDATE`` refuses neither: any unique key matches the earlier row.)"""
    database, spec_class, options, table, query = _setup(kind, mysql_kwargs, postgres_kwargs)
    query(f"CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, code VARCHAR(8) NOT NULL, "
          f"CONSTRAINT {table}_code UNIQUE (code))")
    create_topic(bootstrap, topic_name, 1)
    codes = ["a", "b", "c", "a", "d", "b", "e", "b"]  # e3 repeats e0's code; e5 and e7 repeat e1's
    produce_json(bootstrap, topic_name, [{"id": f"e{i}", "code": code} for i, code in enumerate(codes)])
    spec = spec_class(table=table, key_columns=["id"], **options)
    op = operator(topic_name, spec, pipeline_id=f"dead_{topic_name}", schema="id STRING, code STRING",
                  on_bad_record="dead_letter", write_partitions=1)  # one write task: its one transaction refuses
    summary = run(op)
    assert (summary["records_in"], summary["dead_letters"]) == (8, 3)
    assert sorted(query(f"SELECT id, code FROM {table}")) == [("e0", "a"), ("e1", "b"), ("e2", "c"), ("e4", "d"),
                                                              ("e6", "e")]
    dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 10)  # type: ignore[attr-defined]
    assert sorted(d["kafka_offset"] for d in dead) == [3, 5, 7]
    for letter in dead:
        assert letter["error"].startswith(f"table {table} refused it: ") and \
            letter["error"].endswith("(with an earlier record of the batch)"), letter["error"]
        assert f"{table}_code" in letter["error"], letter["error"]


@pytest.mark.parametrize("kind", ["postgres-two-phase", "mysql-xa"])
def test_records_of_one_value_of_a_unique_index_in_two_write_tasks_do_not_stall_a_two_phase_batch(
        kind, bootstrap, mysql_kwargs, postgres_kwargs, topic_name):
    """Two records with one value of a unique index other than the key, spread to two write tasks of a two-phase
    sink: the later task's insert waits on the earlier task's prepared branch, which keeps its locks until the batch
    commits. Before, PostgreSQL waited without end and MySQL failed the batch on every run after its lock wait
    timeout. Now the wait ends (ROW_LOCK_WAIT_S) and the batch is written again in one task: on PostgreSQL the later
    of the two is refused there and becomes a dead letter; MySQL's ``INSERT .. ON DUPLICATE KEY UPDATE`` takes it as
    an update of the earlier's row (documented)."""
    database, spec_class, options, table, query = _setup(kind, mysql_kwargs, postgres_kwargs)
    query(f"CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, code VARCHAR(8) NOT NULL, "
          f"CONSTRAINT {table}_code UNIQUE (code))")
    create_topic(bootstrap, topic_name, 1)
    # Spread by id into two tasks: e0 and e5 in one, the rest in the other (Spark's hash of the key).
    codes = ["x", "x", "c", "d", "e", "f", "g", "h"]
    produce_json(bootstrap, topic_name, [{"id": f"e{i}", "code": code} for i, code in enumerate(codes)])
    spec = spec_class(table=table, key_columns=["id"], **options)
    op = operator(topic_name, spec, pipeline_id=f"cross_{topic_name}", schema="id STRING, code STRING",
                  on_bad_record="dead_letter", write_partitions=2)
    summary = run(op)
    stored = sorted(query(f"SELECT id, code FROM {table}"))
    rest = [(f"e{i}", code) for i, code in enumerate(codes) if i >= 2]
    if database == "postgres":
        assert (summary["records_in"], summary["dead_letters"]) == (8, 1)
        assert stored in ([("e0", "x"), *rest], [("e1", "x"), *rest]), stored
        dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 10)  # type: ignore[attr-defined]
        assert [d["kafka_offset"] for d in dead] == [1 if stored[0][0] == "e0" else 0]
        assert f"{table}_code" in dead[0]["error"], dead[0]["error"]
    else:
        assert (summary["records_in"], summary["dead_letters"]) == (8, 0)
        assert len(stored) == 7 and stored[1:] == rest and stored[0][1] == "x", stored


def test_a_row_lock_another_transaction_holds_fails_a_two_phase_batch_for_a_retry_not_for_ever(
        bootstrap, mysql_kwargs, postgres_kwargs, topic_name):
    """A transaction outside the pipeline holds the lock of a row the batch updates, past two waits of
    ROW_LOCK_WAIT_S: the task that writes the row waits, the batch is written again in one task, which waits too, and
    the batch fails saying another transaction holds the lock, nothing committed (before, PostgreSQL's two-phase
    sink waited without end). Once the lock is gone, the next attempt commits the batch."""
    import psycopg

    _, spec_class, options, table, query = _setup("postgres-two-phase", mysql_kwargs, postgres_kwargs)
    query(f"CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, code VARCHAR(8) NOT NULL)")
    query(f"INSERT INTO {table} VALUES ('e1', 'old')")
    create_topic(bootstrap, topic_name, 1)
    produce_json(bootstrap, topic_name, [{"id": f"e{i}", "code": f"c{i}"} for i in range(4)])
    op = operator(topic_name, spec_class(table=table, key_columns=["id"], **options),
                  pipeline_id=f"held_{topic_name}", schema="id STRING, code STRING", write_partitions=2)
    with psycopg.connect(**postgres_kwargs) as holder:  # a transaction of another application, left open
        holder.execute(f"SELECT * FROM {table} WHERE id = 'e1' FOR UPDATE")
        with pytest.raises(UnavailableError, match=rf"a write task of table {table} waited {ROW_LOCK_WAIT_S} s for a "
                                                   r"row lock .* with the batch written in one task: another "
                                                   r"transaction holds it"):
            run(op)
        assert sorted(query(f"SELECT id, code FROM {table}")) == [("e1", "old")]
        holder.rollback()
    # The branches of the failed attempt, rolled back (the one a task prepared before the other waited out the lock).
    assert not pg_rows(postgres_kwargs, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                       (f"eo:{pipeline_key(op.pipeline_id)}:%",))
    summary = run(op)
    assert summary["rows_out"] == 4
    assert sorted(query(f"SELECT id, code FROM {table}")) == [(f"e{i}", f"c{i}") for i in range(4)]


def test_a_flood_of_refused_records_past_the_limit_becomes_dead_letters_and_the_batch_commits(
        bootstrap, mysql_kwargs, topic_name):
    """More refused records in one write task than it isolates one by one (500): past those, the slices the table
    still refuses become dead letters whole. Before, the batch failed on every run: a producer stalled it. Nothing is
    lost: every record is in the table or in the dead-letter table, and no refused record is in the table."""
    table = f"flood_{uuid.uuid4().hex[:8]}"
    rows(mysql_kwargs, f"CREATE TABLE {table} (id VARCHAR(16) NOT NULL PRIMARY KEY, n INTEGER NULL, "
                       f"CONSTRAINT {table}_small CHECK (n < 100))")
    create_topic(bootstrap, topic_name, 1)
    events = [{"id": f"e{i:04d}", "n": 100 if i % 4 else i % 100} for i in range(800)]  # 600 refused
    produce_json(bootstrap, topic_name, events)
    spec = MySqlXaSink(table=table, key_columns=["id"])
    op = operator(topic_name, spec, pipeline_id=f"flood_{topic_name}", schema="id STRING, n BIGINT",
                  on_bad_record="dead_letter", write_partitions=1)
    summary = run(op)
    stored = {r[0] for r in rows(mysql_kwargs, f"SELECT id FROM {table}")}
    dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 1_000)  # type: ignore[attr-defined]
    dead_ids = {json.loads(bytes(d["raw_value"]))["id"] for d in dead}
    refused = {e["id"] for e in events if e["n"] >= 100}
    assert summary["dead_letters"] == len(dead) == len(dead_ids) and not stored & dead_ids
    assert stored | dead_ids == {e["id"] for e in events} and refused <= dead_ids
    assert len(stored) >= 100, "the slices refused whole hold a few good records, not the batch"
    errors = [d["error"] for d in dead]
    assert sum("not searched one by one: more than 500 records of this write task refused" in e for e in errors) \
        == len(dead) - 500
