"""The local Kafka broker is real: partitions, idempotence, transactions, read_committed, LSO."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.support.kafka import create_topic


def consume_all(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "isolation.level": isolation,
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    values, eof = [], set()
    while len(eof) < 3:
        msg = consumer.poll(10)
        assert msg is not None, "consumer timed out"
        if msg.error():
            eof.add(msg.partition())
            continue
        values.append(msg.value())
    consumer.close()
    return values


def test_topic_has_three_partitions(bootstrap, topic_name):
    create_topic(bootstrap, topic_name, 3)
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic_name, timeout=10)
    assert sorted(metadata.topics[topic_name].partitions) == [0, 1, 2]


def test_transactions_and_read_committed(bootstrap, topic_name):
    create_topic(bootstrap, topic_name, 3)
    idempotent = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(3):
        idempotent.produce(topic_name, f"plain-{i}".encode(), partition=i)
    assert idempotent.flush(30) == 0

    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic_name}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(3):
        txn.produce(topic_name, f"committed-{i}".encode(), partition=i)
    txn.commit_transaction(30)
    txn.begin_transaction()
    for i in range(3):
        txn.produce(topic_name, f"aborted-{i}".encode(), partition=i)
    txn.flush(30)
    txn.abort_transaction(30)

    committed = sorted(consume_all(bootstrap, topic_name, "read_committed"))
    expected = [f"plain-{i}".encode() for i in range(3)] + [f"committed-{i}".encode() for i in range(3)]
    assert committed == sorted(expected)
    uncommitted = consume_all(bootstrap, topic_name, "read_uncommitted")
    assert sorted(v for v in uncommitted if v.startswith(b"aborted")) == [f"aborted-{i}".encode() for i in range(3)]


def test_last_stable_offset_stays_behind_high_watermark_while_a_transaction_is_open(bootstrap, topic_name):
    create_topic(bootstrap, topic_name, 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic_name, 0)

    def end(isolation):
        futures = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=isolation)
        return futures[tp].result().offset

    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic_name, b"before", partition=0)
    plain.flush(30)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic_name}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for _ in range(5):
        txn.produce(topic_name, b"open", partition=0)
    txn.flush(30)
    assert end(IsolationLevel.READ_UNCOMMITTED) == 6  # high watermark includes the open transaction
    assert end(IsolationLevel.READ_COMMITTED) == 1  # last stable offset stops before it
    txn.commit_transaction(30)
    # The coordinator writes the commit marker asynchronously after commit_transaction returns.
    deadline = time.monotonic() + 15
    while end(IsolationLevel.READ_COMMITTED) != 7 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert end(IsolationLevel.READ_COMMITTED) == 7  # 5 records + the commit marker
