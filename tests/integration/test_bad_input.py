"""Bad records and records lost to retention: clear failures that commit nothing, or recorded skips."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from airflow_eo.core.errors import BadRecordError, ConfigurationError, DataLossError
from airflow_eo.core.xid import Xid
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink
from examples.page_views import produce_page_views
from tests.support.bad_records import (
    BAD_HEADERS,
    BAD_VALUES,
    V1_DEAD_LETTER_DDL,
    assert_headers_kept,
    run_with_driver_dead_letters,
)
from tests.support.kafka import create_topic
from tests.support.operator_harness import counts_table, events_table, operator, rows, run
from tests.support.page_views import our_prepared_branches


def test_malformed_record_fails_the_run_naming_it_and_commits_nothing(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 1)
    produce_page_views(bootstrap, 20, topic=topic_name, raw_values=BAD_VALUES[:1])
    table = events_table(mysql_kwargs)
    op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]))
    with pytest.raises(BadRecordError, match=rf"{topic_name}\[0\] offset 20: malformed JSON.*dead_letter"):
        run(op)
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}")[0][0] == 0
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM eo_offset WHERE pipeline_id = %s", (op.pipeline_id,))[0][0] == 0
    assert rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s", (op.pipeline_id,)) == [("planned",)]


def test_dead_letters_land_with_the_good_records_in_the_same_batch(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 1)
    good = produce_page_views(bootstrap, 30, topic=topic_name, raw_values=BAD_VALUES, raw_headers=BAD_HEADERS)
    table = events_table(mysql_kwargs)
    op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]), on_bad_record="dead_letter")
    summary = run(op)
    assert summary["records_in"] == 33 and summary["rows_out"] == 30 and summary["dead_letters"] == 3
    assert {r[0] for r in rows(mysql_kwargs, f"SELECT event_id FROM {table}")} == {e["event_id"] for e in good}
    dead = rows(mysql_kwargs, "SELECT kafka_offset, batch_id, raw_value, error, kafka_headers FROM eo_dead_letter "
                "WHERE pipeline_id = %s ORDER BY kafka_offset", (op.pipeline_id,))
    assert [d[0] for d in dead] == [30, 31, 32]
    assert {d[1] for d in dead} == {summary["batch_id"]}
    assert [bytes(d[2]) for d in dead] == BAD_VALUES
    assert_headers_kept((d[2], d[4]) for d in dead)
    assert "malformed" in dead[0][3] and "event_id" in dead[1][3] and "'ts' is not a valid timestamp" in dead[2][3]


def test_a_bad_record_found_while_the_xa_sink_writes_still_commits_nothing(bootstrap, mysql_kwargs, topic_name):
    """The XA sink writes and counts bad records in one Spark job (writes stay prepared until the commit point):
    a bad record fails the batch after the write, and its prepared branches are rolled back."""
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 200, topic=topic_name, raw_values=BAD_VALUES[:1])
    table = events_table(mysql_kwargs)
    op = operator(topic_name, MySqlXaSink(table=table, key_columns=["event_id"]))
    with pytest.raises(BadRecordError, match=r"1 bad record\(s\).*malformed JSON.*Nothing was committed"):
        run(op)
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}")[0][0] == 0
    assert our_prepared_branches(mysql_kwargs, op.pipeline_id) == []
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM eo_offset WHERE pipeline_id = %s", (op.pipeline_id,))[0][0] == 0
    assert rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s", (op.pipeline_id,)) == [("planned",)]


@pytest.mark.parametrize("bulk_load", [True, False])
def test_the_upsert_sink_writes_nothing_when_any_partition_has_a_bad_record(bulk_load, bootstrap, mysql_kwargs,
                                                                            topic_name):
    """Its rows are visible as they are written. With bulk load the writer tasks stage their partitions and write
    only when every task of the (barrier) stage counted no bad record: one pass. Without, a first pass counts."""
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 400, topic=topic_name, raw_values=BAD_VALUES[:1])
    table = events_table(mysql_kwargs)
    sink = MySqlUpsertSink(table=table, key_columns=["event_id"], bulk_load=bulk_load)
    with pytest.raises(BadRecordError, match=r"1 bad record\(s\).*malformed JSON.*Nothing was committed"):
        run(operator(topic_name, sink, write_partitions=2))
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}")[0][0] == 0

    good_topic = create_topic(bootstrap, f"{topic_name}_good", 2)
    good = produce_page_views(bootstrap, 400, topic=good_topic)
    summary = run(operator(good_topic, sink, write_partitions=2))
    assert summary["rows_out"] == 400
    assert {r[0] for r in rows(mysql_kwargs, f"SELECT event_id FROM {table}")} == {e["event_id"] for e in good}
    assert ("read_transform" in summary["seconds"]) is not bulk_load  # one Spark job with bulk load, else two


@pytest.mark.parametrize("sink_class", [MySqlXaSink, MySqlUpsertSink])
def test_one_pass_batches_count_and_dead_letter_every_bad_record(sink_class, bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 3)
    good = produce_page_views(bootstrap, 300, topic=topic_name, raw_values=BAD_VALUES * 2, raw_headers=BAD_HEADERS)
    table = events_table(mysql_kwargs)
    op = operator(topic_name, sink_class(table=table, key_columns=["event_id"]), on_bad_record="dead_letter")
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (306, 300, 6)
    assert "write" in summary["seconds"] and "read_transform" not in summary["seconds"]  # one Spark job
    assert {r[0] for r in rows(mysql_kwargs, f"SELECT event_id FROM {table}")} == {e["event_id"] for e in good}
    dead = rows(mysql_kwargs, "SELECT raw_value, batch_id, kafka_headers FROM eo_dead_letter WHERE pipeline_id = %s",
                (op.pipeline_id,))
    assert sorted(bytes(d[0]) for d in dead) == sorted(BAD_VALUES * 2)
    assert {d[1] for d in dead} == {summary["batch_id"]}
    assert_headers_kept((d[0], d[2]) for d in dead)
    assert our_prepared_branches(mysql_kwargs, op.pipeline_id) == []
    # Written by the tasks that found them, in the same Spark job: nothing went through the driver ...
    assert "dead_letters" not in summary["seconds"]
    if sink_class is MySqlXaSink:  # ... each task's in its own branch, committed with the batch's
        xids = json.loads(rows(mysql_kwargs, "SELECT xids FROM eo_batch WHERE pipeline_id = %s AND batch_id = %s",
                               (op.pipeline_id, summary["batch_id"]))[0][0])
        partitions = [Xid.decode(x).partition for x in xids]
        assert [p for p in partitions if p < -1], f"no task wrote its dead letters: {xids}"


def test_a_batch_with_a_transform_dead_letters_by_the_executors_in_their_own_branches(bootstrap, mysql_kwargs,
                                                                                       topic_name):
    """A transform stands between the parsed records and the sink's writers: the job that writes the counts also
    counts the parsed records (one pass over the batch), and the bad records are written by a Spark job of their
    own, each task in its own XA branch (never one of the good rows' branches)."""
    create_topic(bootstrap, topic_name, 2)
    good = produce_page_views(bootstrap, 200, topic=topic_name, raw_values=BAD_VALUES * 3, raw_headers=BAD_HEADERS)
    table = counts_table(mysql_kwargs)
    op = operator(topic_name, MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"}),
                  on_bad_record="dead_letter", transform="airflow_eo.examples.page_views.count_per_app")
    summary = run(op)
    assert (summary["records_in"], summary["dead_letters"]) == (209, 9)
    assert not {"count", "read_transform", "dead_letters"} & set(summary["seconds"]), summary["seconds"]
    assert sum(r[0] for r in rows(mysql_kwargs, f"SELECT pv FROM {table}")) == len(good)
    dead = rows(mysql_kwargs, "SELECT raw_value, kafka_headers FROM eo_dead_letter WHERE pipeline_id = %s",
                (op.pipeline_id,))
    assert sorted(bytes(d[0]) for d in dead) == sorted(BAD_VALUES * 3)
    assert_headers_kept(dead)
    xids = json.loads(rows(mysql_kwargs, "SELECT xids FROM eo_batch WHERE pipeline_id = %s",
                           (op.pipeline_id,))[0][0])
    partitions = [Xid.decode(x).partition for x in xids]
    assert [p for p in partitions if p >= 0] and [p for p in partitions if p < -1], xids
    assert our_prepared_branches(mysql_kwargs, op.pipeline_id) == []


def test_a_bad_record_behind_a_transform_fails_the_xa_batch_after_its_one_pass_and_commits_nothing(
        bootstrap, mysql_kwargs, topic_name):
    """The write job counts the records it aggregates: a batch without bad records is read once; one with a bad
    record fails after the write, naming it, and its prepared branches are rolled back."""
    create_topic(bootstrap, topic_name, 2)
    good = produce_page_views(bootstrap, 150, topic=topic_name)
    table = counts_table(mysql_kwargs)
    op = operator(topic_name, MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"}),
                  transform="airflow_eo.examples.page_views.count_per_app")
    summary = run(op)
    assert (summary["records_in"], summary["dead_letters"]) == (150, 0)
    assert not {"count", "read_transform", "dead_letters"} & set(summary["seconds"]), summary["seconds"]  # one job
    assert sum(r[0] for r in rows(mysql_kwargs, f"SELECT pv FROM {table}")) == len(good)

    produce_page_views(bootstrap, 40, topic=topic_name, raw_values=BAD_VALUES[1:2])
    with pytest.raises(BadRecordError, match=r"1 bad record\(s\).*event_id.*Nothing was committed"):
        run(op)
    assert sum(r[0] for r in rows(mysql_kwargs, f"SELECT pv FROM {table}")) == len(good)
    assert our_prepared_branches(mysql_kwargs, op.pipeline_id) == []
    assert rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
                (op.pipeline_id,)) == [("committed",), ("planned",)]


def test_dead_letters_through_the_driver_keep_their_headers_in_a_table_an_older_release_made(
        bootstrap, mysql_kwargs, topic_name):
    """The driver's path (a sink without an executor-side writer) carries the headers too; a dead-letter table made
    before ``kafka_headers`` existed is read as it is, then gains the column before the batch writes to it: its old
    row keeps NULL (headers not kept), the new ones their headers."""
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 100, topic=topic_name, raw_values=BAD_VALUES, raw_headers=BAD_HEADERS)
    table, dead_table, pipeline = events_table(mysql_kwargs), f"eo_dl_{uuid.uuid4().hex[:8]}", f"dl_{topic_name}"
    rows(mysql_kwargs, V1_DEAD_LETTER_DDL.format(name=dead_table))
    rows(mysql_kwargs, f"INSERT INTO {dead_table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, "
         "raw_value, error) VALUES (%s, 'before', 0, 0, 0, 'old', 'bad')", (pipeline,))
    spec = MySqlXaSink(table=table, key_columns=["event_id"], dead_letter_table=dead_table)
    [old] = build_sink(spec, pipeline, "eo_offset_store").dead_letters(pipeline, None, 10)  # type: ignore[attr-defined]
    assert old["raw_value"] == b"old" and "kafka_headers" not in old

    summary = run_with_driver_dead_letters(spec, pipeline, topic_name)
    assert (summary.records_in, summary.rows_out, summary.dead_letters) == (103, 100, 3)
    assert "dead_letters" in summary.seconds  # the engine's time of the pass through the driver
    (xids,), = rows(mysql_kwargs, "SELECT xids FROM eo_batch WHERE pipeline_id = %s", (pipeline,))
    assert -1 in [Xid.decode(x).partition for x in json.loads(xids)]  # the driver's XA branch, committed
    dead = rows(mysql_kwargs, f"SELECT topic, raw_value, kafka_headers FROM {dead_table} WHERE pipeline_id = %s",
                (pipeline,))
    assert [(t, h) for t, _, h in dead if t == "before"] == [("before", None)]
    assert_headers_kept((v, h) for t, v, h in dead if t != "before")
    # Read back in SQL, as README shows: one row per header, in order, values decoded from base64.
    headers = rows(mysql_kwargs, f"SELECT h.header_key, FROM_BASE64(h.header_value) FROM {dead_table} d, JSON_TABLE("
                   "d.kafka_headers, '$[*]' COLUMNS (n FOR ORDINALITY, header_key TEXT PATH '$.key', header_value "
                   "TEXT PATH '$.value')) AS h WHERE d.pipeline_id = %s AND d.raw_value = %s ORDER BY h.n",
                   (pipeline, BAD_VALUES[1]))
    assert [(k, None if v is None else bytes(v)) for k, v in headers] == BAD_HEADERS[1]
    assert our_prepared_branches(mysql_kwargs, pipeline) == []


def test_an_older_dead_letter_table_another_pipelines_branch_holds_gets_dead_letters_without_headers_meanwhile(
        bootstrap, mysql_kwargs, topic_name):
    """The column cannot be added while another pipeline's prepared XA branch (in doubt until that pipeline runs
    again) holds the table: this pipeline's batch still commits, its dead letters without headers (NULL: not kept),
    and a batch after that branch ended adds the column and keeps them."""
    import pymysql

    create_topic(bootstrap, topic_name, 1)
    produce_page_views(bootstrap, 20, topic=topic_name, raw_values=BAD_VALUES, raw_headers=BAD_HEADERS)
    table, dead_table = events_table(mysql_kwargs), f"eo_dl_{uuid.uuid4().hex[:8]}"
    rows(mysql_kwargs, V1_DEAD_LETTER_DDL.format(name=dead_table))
    other = pymysql.connect(**mysql_kwargs)
    try:
        with other.cursor() as cur:  # another pipeline's dead letter, prepared and in doubt
            cur.execute("XA START 'eo_test_other_pipeline'")
            cur.execute(f"INSERT INTO {dead_table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, "
                        "error) VALUES ('other', 't', 0, 0, 0, 'bad')")
            cur.execute("XA END 'eo_test_other_pipeline'")
            cur.execute("XA PREPARE 'eo_test_other_pipeline'")
        op = operator(topic_name, MySqlXaSink(table=table, key_columns=["event_id"], dead_letter_table=dead_table),
                      on_bad_record="dead_letter")
        summary = run(op)
        assert (summary["rows_out"], summary["dead_letters"]) == (20, 3)
        columns = [r[0] for r in rows(mysql_kwargs, f"SHOW COLUMNS FROM {dead_table}")]
        assert "kafka_headers" not in columns
        dead = rows(mysql_kwargs, f"SELECT raw_value FROM {dead_table} WHERE pipeline_id = %s", (op.pipeline_id,))
        assert sorted(bytes(d[0]) for d in dead) == sorted(BAD_VALUES)
    finally:
        with other.cursor() as cur:
            cur.execute("XA ROLLBACK 'eo_test_other_pipeline'")
        other.close()

    produce_page_views(bootstrap, 10, topic=topic_name, raw_values=BAD_VALUES, raw_headers=BAD_HEADERS)
    assert run(op)["dead_letters"] == 3
    dead = rows(mysql_kwargs, f"SELECT raw_value, kafka_headers, batch_id FROM {dead_table} WHERE pipeline_id = %s",
                (op.pipeline_id,))
    assert sorted(h is None for _, h, b in dead if b == 0) == [True] * 3  # the first batch's: not kept
    assert_headers_kept((v, h) for v, h, b in dead if b == 1)


def test_records_deleted_by_retention_fail_the_run_or_are_skipped_and_recorded(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 1)
    produce_page_views(bootstrap, 50, topic=topic_name)
    table = events_table(mysql_kwargs)
    op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]))
    assert run(op)["records_in"] == 50
    later = produce_page_views(bootstrap, 50, topic=topic_name)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic_name, 0, 80)]).values():
        future.result()

    with pytest.raises(DataLossError, match=rf"{topic_name}\[0\] offsets 50\.\.79"):
        run(op)
    assert rows(mysql_kwargs, "SELECT next_offset FROM eo_offset WHERE pipeline_id = %s", (op.pipeline_id,)) == [(50,)]
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}")[0][0] == 50

    op_skip = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]),
                       pipeline_id=op.pipeline_id, skip_lost_records=True)
    summary = run(op_skip)
    assert summary["skipped"] == [{"topic": topic_name, "partition": 0, "from_offset": 50, "until_offset": 80}]
    assert summary["ranges"][0]["from_offset"] == 80 and summary["ranges"][0]["until_offset"] == 100
    stored = {r[0] for r in rows(mysql_kwargs, f"SELECT event_id FROM {table}")}
    assert {e["event_id"] for e in later[30:]} <= stored and not {e["event_id"] for e in later[:30]} & stored


def test_misconfiguration_fails_before_any_side_effect(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 1)
    with pytest.raises(ConfigurationError, match="does not exist"):
        run(operator(topic_name, MySqlUpsertSink(table="no_such_table", key_columns=["event_id"])))
    table = events_table(mysql_kwargs)
    with pytest.raises(ConfigurationError, match="no key column"):
        run(operator(topic_name, MySqlUpsertSink(table=table, key_columns=["nope"])))
    with pytest.raises(ConfigurationError, match="PRIMARY KEY or UNIQUE index"):
        run(operator(topic_name, MySqlUpsertSink(table=table, key_columns=["app_id"])))
    with pytest.raises(ConfigurationError, match="does not exist on"):
        run(operator("no_such_topic_x", MySqlUpsertSink(table=table, key_columns=["event_id"])))
