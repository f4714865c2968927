"""Spark's own Kafka source reads exactly an offset range from the real broker."""

from __future__ import annotations

from confluent_kafka import Producer

from airflow_eo.core.ranges import OffsetRange, spark_offsets
from airflow_eo.spark.session import KAFKA_CONSUMER_POOL_LOGGER, KAFKA_CONSUMERS_KEPT, get_session
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


def open_kafka_consumers(spark) -> int:
    """Kafka consumers open in the session's JVM: each registers its ``app-info`` MBean until it is closed. (Called
    through the MBeanServer interface: py4j cannot call the JDK's own class of it, which its module does not open.)"""
    gateway = spark.sparkContext._gateway
    jvm, java_class = gateway.jvm, gateway.jvm.java.lang.Class
    parameters = gateway.new_array(java_class, 2)
    parameters[0], parameters[1] = java_class.forName("javax.management.ObjectName"), java_class.forName(
        "javax.management.QueryExp")
    query_names = java_class.forName("javax.management.MBeanServer").getMethod("queryNames", parameters)
    arguments = gateway.new_array(jvm.java.lang.Object, 2)
    arguments[0] = jvm.javax.management.ObjectName("kafka.consumer:type=app-info,*")
    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    return query_names.invoke(server, arguments).size()


def test_a_read_of_many_partitions_leaves_fewer_consumers_open_than_partitions(bootstrap, topic_name):
    # Every query reads with consumers of its own (their group is the query's), and Spark keeps up to 64 of them
    # idle for five minutes, each with its topic's metadata and last fetch: a batch over 1,000 partitions grew the
    # driver's JVM 2.3x. Our sessions keep KAFKA_CONSUMERS_KEPT.
    partitions = 12
    create_topic(bootstrap, topic_name, partitions)
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(partitions):
        for i in range(5):
            producer.produce(topic_name, f"{p}-{i}".encode(), partition=p)
    assert producer.flush(30) == 0
    spark = get_session()
    assert spark.sparkContext.getConf().get("spark.kafka.consumer.cache.capacity") == str(KAFKA_CONSUMERS_KEPT)
    for _ in range(2):
        rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic_name).option("startingOffsets", "earliest")
                .option("endingOffsets", "latest").load().count())
        assert rows == partitions * 5
    # At Spark's default, 24 after one read here and 48 after two.
    assert open_kafka_consumers(spark) < partitions
    # Past its capacity the pool warns at every read, which says nothing wrong: only its errors are logged.
    level = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getLogger(KAFKA_CONSUMER_POOL_LOGGER).getLevel()
    assert level.toString() == "ERROR"
