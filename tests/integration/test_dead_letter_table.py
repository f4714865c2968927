"""A MySQL sink's dead-letter table keeps ids and topics that differ only in case apart (the server's default
collation, latin1_swedish_ci on the stack, made topics "Orders" and "orders" one key); an older release's table
gains its new columns once, whoever adds them first."""

from __future__ import annotations

import uuid

from airflow_eo.hooks.sinks import build_sink
from airflow_eo.mysql.sql import dead_letter_ddl
from airflow_eo.sinks import MySqlXaSink
from tests.integration.test_bad_input import V1_DEAD_LETTER_DDL


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
