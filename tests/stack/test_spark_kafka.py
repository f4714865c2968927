"""Spark's own Kafka source reads exactly an offset range from the real broker."""

from __future__ import annotations

from confluent_kafka import Producer

from airflow_eo.core.ranges import OffsetRange, spark_offsets
from airflow_eo.spark.session import get_session
from tests.support.kafka import create_topic


def test_batch_read_of_exact_offset_ranges_read_committed(bootstrap, topic_name):
    create_topic(bootstrap, topic_name, 3)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for p in range(3):
        for i in range(10):
            producer.produce(topic_name, f"{p}-{i}".encode(), partition=p)
    producer.commit_transaction(30)

    ranges = [OffsetRange(topic_name, 0, 2, 5), OffsetRange(topic_name, 1, 0, 10), OffsetRange(topic_name, 2, 9, 11)]
    starting, ending = spark_offsets(ranges)
    spark = get_session()
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("assign", f'{{"{topic_name}": [0, 1, 2]}}')
            .option("startingOffsets", starting).option("endingOffsets", ending)
            .option("kafka.isolation.level", "read_committed").option("failOnDataLoss", "true")
            .load().selectExpr("partition", "offset", "CAST(value AS STRING) AS v").collect())
    got = sorted((r.partition, r.offset, r.v) for r in rows)
    # Offset 10 of partition 2 is the transaction's commit marker: a gap, not a record.
    expected = sorted([(0, o, f"0-{o}") for o in range(2, 5)] + [(1, o, f"1-{o}") for o in range(10)]
                      + [(2, 9, "2-9")])
    assert got == expected
