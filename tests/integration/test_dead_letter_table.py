"""A MySQL sink's dead-letter table keeps ids and topics that differ only in case apart (the server's default
collation, latin1_swedish_ci on the stack, made topics "Orders" and "orders" one key); an older release's table
gains its new columns once, whoever adds them first."""

from __future__ import annotations

import uuid

import pytest

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.mysql.sql import dead_letter_ddl
from airflow_eo.sinks import MySqlXaSink
from tests.support.bad_records import V1_DEAD_LETTER_DDL


def test_dead_letters_of_topics_that_differ_only_in_case_are_two_rows(mysql):
    table = f"eo_dl_{uuid.uuid4().hex[:8]}"
    with mysql.cursor() as cur:
        cur.execute(dead_letter_ddl(table))
        try:
            for pipeline, topic in (("p", "Orders"), ("p", "orders"), ("P", "orders")):
                cur.execute(f"INSERT INTO {table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, "
                            "error) VALUES (%s, %s, 0, 5, 0, 'bad')", (pipeline, topic))
            cur.execute(f"SELECT topic FROM {table} WHERE pipeline_id = 'p' ORDER BY topic")
            assert cur.fetchall() == (("Orders",), ("orders",))
        finally:
            cur.execute(f"DROP TABLE {table}")


def test_two_pipelines_upgrading_an_older_table_at_once_both_go_on(mysql):
    """Both found the table without ``kafka_headers`` and both add it: the second's duplicate column counts as
    done (MySQL has no ``ADD COLUMN IF NOT EXISTS``)."""
    table = f"eo_dl_{uuid.uuid4().hex[:8]}"
    with mysql.cursor() as cur:
        cur.execute(V1_DEAD_LETTER_DDL.format(name=table))
        try:
            cur.execute(f"SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                        f"AND TABLE_NAME = '{table}'")
            seen = [r[0] for r in cur.fetchall()]  # what both looked up
            sink = build_sink(MySqlXaSink(table="t", key_columns=["k"], dead_letter_table=table), "p",
                              "eo_offset_store")
            for _ in range(2):
                sink._upgrade_dead_letter_table(cur, seen)  # type: ignore[attr-defined]
            cur.execute(f"SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE "
                        f"TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' AND COLUMN_NAME = 'kafka_headers'")
            assert cur.fetchall() == (("kafka_headers", "longtext"),)
        finally:
            cur.execute(f"DROP TABLE {table}")


def _collations(mysql, table: str) -> dict[str, str]:
    with mysql.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE "
                    "TABLE_SCHEMA = DATABASE() "
                    "AND TABLE_NAME = %s AND COLUMN_NAME IN ('pipeline_id', 'topic')", (table,))
        return dict(cur.fetchall())


def _batch(pipeline: str, *topics: str) -> BatchContext:
    return BatchContext(pipeline, 0, "run", 1, tuple(OffsetRange(t, 0, 0, 10) for t in topics))


def test_an_older_releases_case_insensitive_table_is_converted_before_a_batch_writes_dead_letters(mysql):
    """The older release's table (the server's default collation: latin1_swedish_ci here) has "p" = "P": the first
    writer of a batch converts it, after which both pipelines' dead letters are rows of their own, and each pipeline
    reads only its own."""
    table = f"eo_dl_{uuid.uuid4().hex[:8]}"
    with mysql.cursor() as cur:
        cur.execute(V1_DEAD_LETTER_DDL.format(name=table))
        try:
            assert set(_collations(mysql, table).values()) != {"utf8mb4_bin"}  # what the older release left
            cur.execute(f"INSERT INTO {table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, error) "
                        "VALUES ('P', 'orders', 0, 5, 0, 'bad of P')")
            sink = build_sink(MySqlXaSink(table="t", key_columns=["k"], dead_letter_table=table), "p",
                              "eo_offset_store")
            # The reader compares byte for byte even before the conversion.
            assert sink.dead_letters("p", None, 10) == []  # type: ignore[attr-defined]
            sink.dead_letter_writer(_batch("p", "orders"))  # type: ignore[attr-defined]
            assert _collations(mysql, table) == {"pipeline_id": "utf8mb4_bin", "topic": "utf8mb4_bin"}
            cur.execute(f"INSERT INTO {table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, error) "
                        "VALUES ('p', 'orders', 0, 5, 0, 'bad of p')")  # a duplicate key before the conversion
            assert [d["error"] for d in sink.dead_letters("p", None, 10)] == ["bad of p"]  # type: ignore[attr-defined]
            assert [d["error"] for d in sink.dead_letters("P", None, 10)] == ["bad of P"]  # type: ignore[attr-defined]
        finally:
            cur.execute(f"DROP TABLE {table}")


def test_a_table_that_cannot_be_converted_yet_refuses_only_a_batch_whose_keys_could_meet(mysql_kwargs, mysql,
                                                                                         monkeypatch):
    """Another pipeline's prepared XA branch holds the older table: the conversion waits a few seconds and gives up.
    A pipeline whose ids and topics meet no other key goes on; one whose id equals another's but for case is refused,
    with the statement to run."""
    import pymysql

    from airflow_eo.mysql import sink as mysql_sink

    monkeypatch.setattr(mysql_sink, "DEAD_LETTER_UPGRADE_WAIT_S", 1)  # each give-up after 1 s, not 5

    table = f"eo_dl_{uuid.uuid4().hex[:8]}"
    with mysql.cursor() as cur:
        cur.execute(V1_DEAD_LETTER_DDL.format(name=table))
    holder = pymysql.connect(**mysql_kwargs)
    xid = f"eo_test_hold_{table}"
    try:
        with holder.cursor() as cur:
            cur.execute("XA START %s", (xid,))
            cur.execute(f"INSERT INTO {table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, error) "
                        "VALUES ('Orders_Job', 'orders', 0, 1, 0, 'bad')")
            cur.execute("XA END %s", (xid,))
            cur.execute("XA PREPARE %s", (xid,))
        with mysql.cursor() as cur:
            cur.execute(f"INSERT INTO {table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, error) "
                        "VALUES ('ORDERS_JOB', 'orders', 0, 9, 0, 'bad')")
        spec = MySqlXaSink(table="t", key_columns=["k"], dead_letter_table=table)
        build_sink(spec, "other_job", "eo_offset_store").dead_letter_writer(  # type: ignore[attr-defined]
            _batch("other_job", "orders"))
        with pytest.raises(ConfigurationError, match=r"pipelines \['ORDERS_JOB'\] and 'orders_job'.*ALTER TABLE"):
            build_sink(spec, "orders_job", "eo_offset_store").dead_letter_writer(  # type: ignore[attr-defined]
                _batch("orders_job", "orders"))
        with pytest.raises(ConfigurationError, match=r"topics \['Orders', 'orders'\]"):
            build_sink(spec, "other_job", "eo_offset_store").dead_letter_writer(  # type: ignore[attr-defined]
                _batch("other_job", "orders", "Orders"))
        assert set(_collations(mysql, table).values()) != {"utf8mb4_bin"}
    finally:
        with holder.cursor() as cur:
            cur.execute("XA ROLLBACK %s", (xid,))
        holder.close()
        with mysql.cursor() as cur:
            cur.execute(f"DROP TABLE {table}")
