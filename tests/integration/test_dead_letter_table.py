"""A MySQL sink's dead-letter table keeps ids and topics that differ only in case apart (the server's default
collation, latin1_swedish_ci on the stack, made topics "Orders" and "orders" one key)."""

from __future__ import annotations

import uuid

from airflow_eo.mysql.sql import dead_letter_ddl


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
