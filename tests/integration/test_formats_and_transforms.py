"""Value formats and the three kinds of transform (callable, dotted path, Spark SQL)."""

from __future__ import annotations

from collections import Counter

from confluent_kafka import Producer

from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink
from examples.page_views import produce_page_views
from tests.support.kafka import create_topic
from tests.support.operator_harness import counts_table, events_table, operator, rows, run


def test_string_values_with_a_sql_transform(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 2)
    producer = Producer({"bootstrap.servers": bootstrap})
    lines = [f"e{i},app_{i % 3},user_{i}" for i in range(40)]
    for i, line in enumerate(lines):
        producer.produce(topic_name, line.encode(), partition=i % 2)
    producer.flush(30)
    table = events_table(mysql_kwargs)
    op = KafkaMicroBatchOperator(
        task_id="sql_transform", pipeline_id=f"p_{topic_name}", topics=topic_name, value_format="string",
        transform="SELECT split(value, ',')[0] AS event_id, split(value, ',')[1] AS app_id, "
                  "split(value, ',')[2] AS user_id FROM kafka_batch",
        sink=MySqlUpsertSink(table=table, key_columns=["event_id"]),
    )
    summary = run(op)
    assert summary["records_in"] == 40 and summary["rows_out"] == 40
    got = sorted(rows(mysql_kwargs, f"SELECT event_id, app_id, user_id FROM {table}"))
    assert got == sorted(tuple(line.split(",")) for line in lines)


def test_dotted_path_transform_into_the_xa_sink(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 3)
    events = produce_page_views(bootstrap, 120, topic=topic_name)
    table = counts_table(mysql_kwargs)
    op = operator(topic_name, MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"}),
                  transform="airflow_eo.examples.page_views.count_per_app")
    run(op)
    produce_more = produce_page_views(bootstrap, 30, topic=topic_name)
    second = run(op)
    assert second["records_in"] == 30
    expected = Counter(e["app_id"] for e in events + produce_more)
    assert dict(rows(mysql_kwargs, f"SELECT app_id, pv FROM {table}")) == dict(expected)
