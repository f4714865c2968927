"""Kafka → Spark → Kafka exactly once with Kafka transactions (the ip_counts_kafka job)."""

from __future__ import annotations

import json
import signal
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from airflow_eo.core.errors import BadRecordError
from airflow_eo.core.verify import Check
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.kafka.offsets import group_id
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import KafkaTransactionalSink
from examples import ip_counts
from examples.state import reset_ip_counts
from examples.topics import read_topic
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.kafka_group import group_positions, kafka_adapter
from tests.support.lineage import assert_batch_lineage, completes, file_transport
from tests.support.operator_harness import rows, run
from tests.support.page_views import run_dag

PIPELINE = "ip_counts_kafka"


def assert_exact(bootstrap: str, mysql_kwargs: dict) -> None:
    assert ip_counts.output_counts(bootstrap) == ip_counts.true_counts(bootstrap)
    store = dict(((t, p), o) for t, p, o in rows(
        mysql_kwargs, "SELECT topic, kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s", (PIPELINE,)))
    assert store == group_positions(bootstrap, PIPELINE, ip_counts.SOURCE), "store and Kafka group disagree"
    states = {r[0] for r in rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s", (PIPELINE,))}
    assert states <= {"committed", "aborted"}


def test_several_runs_sum_to_the_true_counts(bootstrap, mysql_kwargs, airflow_db, tmp_path):
    reset_ip_counts(bootstrap, mysql_kwargs)
    ip_counts.produce_lines(bootstrap, 2000)
    lineage = tmp_path / "openlineage.json"
    done = run_dag("ip_counts_kafka", env=file_transport(lineage))
    assert done.returncode == 0, why(done)
    assert_exact(bootstrap, mysql_kwargs)
    ip_counts.produce_lines(bootstrap, 1500)
    # Two more runs in one child (its Python and Spark start paid once): the new lines, then none (an empty batch).
    now = datetime.now(timezone.utc)
    done = run_dag("ip_counts_kafka", [now - timedelta(seconds=1), now], env=file_transport(lineage))
    assert done.returncode == 0, why(done)
    assert_exact(bootstrap, mysql_kwargs)
    # Each run's COMPLETE event as the OpenLineage provider's file transport wrote it: the output topic in the
    # Kafka naming of the spec (kafka://bootstrap + topic), like the input.
    facets = [assert_batch_lineage(e, [(f"kafka://{bootstrap}", ip_counts.SOURCE)],
                                   (f"kafka://{bootstrap}", ip_counts.SINK), PIPELINE)
              for e in completes(lineage, "ip_counts_kafka.count_ips")]
    assert [f["recordsIn"] for f in facets] == [2000, 1500, 0]


def test_sigkill_at_each_step_keeps_the_output_exact(bootstrap, mysql_kwargs, airflow_db):
    """One run killed at each step in turn, each attempt meeting what the last crash left, then runs go on."""
    reset_ip_counts(bootstrap, mysql_kwargs)
    ip_counts.produce_lines(bootstrap, 4000)
    logical_date = datetime.now(timezone.utc)
    # after_kafka_commit last: the retry after it must roll the store forward, not run the batch again.
    for point in ["before_produce", "mid_produce", "after_last_send", "after_kafka_commit"]:
        crashed = run_dag("ip_counts_kafka", logical_date, fault=point)
        assert crashed.returncode == -signal.SIGKILL, f"not killed at {point}: {why(crashed)}"
        # What a read_committed consumer sees of a batch: all of it or none of it. Until the Kafka commit no
        # record of the batch, even once every record was sent; after it, every line of the planned 4,000 once
        # (the counts of one batch sum to its lines), before the store knows.
        seen = sum(ip_counts.output_counts(bootstrap).values())
        assert seen == (4000 if point == "after_kafka_commit" else 0), f"read_committed saw {seen} after {point}"
        if point == "after_last_send":
            assert sum(ip_counts.output_counts(bootstrap, "read_uncommitted").values()) >= 4000, \
                "the batch's records were not in the log: the read_committed check above proves nothing"
        ip_counts.produce_lines(bootstrap, 300)
    # The same run again (it rolls the store forward: its batch is in Kafka), then a later run that reads the lines
    # produced since: one child for both (the later run's batch starts where the rolled-forward one ends).
    ip_counts.produce_lines(bootstrap, 700)
    runs = run_dag("ip_counts_kafka", [logical_date, datetime.now(timezone.utc)])
    assert runs.returncode == 0, why(runs)
    assert "rolling forward" in runs.stdout + runs.stderr
    assert_exact(bootstrap, mysql_kwargs)
    # The killed attempts' records reached the log and were aborted: only read_uncommitted sees them.
    uncommitted = ip_counts.output_counts(bootstrap, "read_uncommitted")
    assert sum(uncommitted.values()) > sum(ip_counts.output_counts(bootstrap).values())


def test_an_old_producer_that_wakes_up_is_fenced_and_never_visible(bootstrap, topic_name):
    out = create_topic(bootstrap, f"{topic_name}_out", 1)
    pipeline = f"fence_{topic_name}"
    old = kafka_adapter(bootstrap, pipeline, KafkaTransactionalSink(topic=out))
    old_producer = old.producer()
    old_producer.begin_transaction()
    old_producer.produce(out, b"zombie-1")
    old_producer.flush(30)
    newer = kafka_adapter(bootstrap, pipeline, KafkaTransactionalSink(topic=out))
    newer.producer()  # init_transactions with the same transactional.id fences the old producer
    with pytest.raises(KafkaException):
        old_producer.produce(out, b"zombie-2")
        old_producer.flush(30)
        old_producer.commit_transaction(30)
    newer_producer = newer.producer()
    newer_producer.begin_transaction()
    newer_producer.produce(out, b"newer")
    newer_producer.commit_transaction(30)
    committed = [v for _, v in read_topic(bootstrap, out)[0]]
    assert committed == [b"newer"]
    assert b"zombie-1" in [v for _, v in read_topic(bootstrap, out, "read_uncommitted")[0]]


def test_group_offsets_right_after_a_commit_wait_for_the_commit_markers(bootstrap, topic_name):
    """Just after ``commit_transaction`` the broker answers UNSTABLE_OFFSET_COMMIT for the group's partitions
    (seen on most tries here); recovery must read the committed offsets then, not take the group for empty.
    The first commit matters most: a listing of the group's offsets shows nothing while only pending
    transactional offsets exist (a fresh-clone CI run saw ``{}`` there); named partitions are answered unstable."""
    source = create_topic(bootstrap, f"{topic_name}_in", 3)
    out = create_topic(bootstrap, f"{topic_name}_out", 1)
    adapter = kafka_adapter(bootstrap, f"stable_{topic_name}", KafkaTransactionalSink(topic=out))
    producer = adapter.producer()
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id(adapter.pipeline_id)})
    partitions = [(source, p) for p in range(3)]
    for end in range(1, 11):
        producer.begin_transaction()
        producer.produce(out, b"x")
        producer.send_offsets_to_transaction([TopicPartition(source, p, end) for p in range(3)],
                                             group.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        assert adapter.group_offsets(partitions) == {(source, p): end for p in range(3)}
    group.close()


def test_a_batch_with_empty_output_commits_offsets_only(bootstrap, mysql_kwargs, topic_name):
    source = create_topic(bootstrap, f"{topic_name}_in", 2)
    out = create_topic(bootstrap, f"{topic_name}_out", 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce(source, f"line {i}".encode(), partition=i % 2)
    producer.flush(30)
    op = KafkaMicroBatchOperator(task_id="empty_out", pipeline_id=f"p_{topic_name}", topics=[source],
                                 value_format="string",
                                 transform="SELECT value AS key, value FROM kafka_batch WHERE false",
                                 sink=KafkaTransactionalSink(topic=out))
    summary = run(op)
    assert summary["records_in"] == 10 and summary["rows_out"] == 0
    assert read_topic(bootstrap, out, "read_uncommitted")[0] == []
    assert group_positions(bootstrap, op.pipeline_id, source) == {(source, 0): 5, (source, 1): 5}
    stored = rows(mysql_kwargs, "SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                  (op.pipeline_id,))
    assert sorted(stored) == [(0, 5), (1, 5)]


def lines_to_topic(bootstrap: str, topic_name: str, value_format: str,
                   out_partitions: int = 1) -> tuple[KafkaMicroBatchOperator, str]:
    """Three lines in a topic of their own, and an operator copying each (as key and value) to an output topic:
    (the operator, the output topic)."""
    source = create_topic(bootstrap, f"{topic_name}_in", 1)
    out = create_topic(bootstrap, f"{topic_name}_out", out_partitions)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        producer.produce(source, f"line {i}".encode())
    producer.flush(30)
    op = KafkaMicroBatchOperator(task_id="lines_out", pipeline_id=f"p_{topic_name}", topics=[source],
                                 value_format=value_format, transform="SELECT value AS key, value FROM kafka_batch",
                                 sink=KafkaTransactionalSink(topic=out))
    return op, out


def test_verify_names_a_transaction_left_open_on_the_output_topic(bootstrap, topic_name):
    """``airflow eo verify``: a transaction open on the output topic while no batch is unfinished (a producer that
    died mid-batch) holds back every read_committed reader; verify names the partition until it ends."""
    op, out = lines_to_topic(bootstrap, topic_name, "string", out_partitions=2)
    run(op)
    ops = pipeline_operations("eo_offset_store", "kafka_default")

    def in_doubt() -> list[Any]:
        return [f for f in ops.verify(op.pipeline_id).findings if f.check is Check.IN_DOUBT]

    assert in_doubt() == []
    stray = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"stray-{topic_name}"})
    stray.init_transactions(30)
    stray.begin_transaction()
    stray.produce(out, b"never committed", partition=1)
    stray.flush(30)
    [found] = in_doubt()
    assert found.subject == f"{out}[1]" and "a transaction is open (last stable offset" in found.message
    stray.abort_transaction(30)
    assert in_doubt() == []


def test_binary_key_and_value_columns_are_produced_as_they_are(bootstrap, mysql_kwargs, topic_name):
    # Spark hands BINARY values to the driver as bytearray, which the producer refuses (read-only bytes only).
    op, out = lines_to_topic(bootstrap, topic_name, "bytes")
    assert run(op)["rows_out"] == 3
    assert sorted(read_topic(bootstrap, out)[0]) == [(f"line {i}".encode(),) * 2 for i in range(3)]


def test_transaction_timeout_beyond_the_brokers_maximum_is_refused(bootstrap, topic_name):
    out = create_topic(bootstrap, topic_name, 1)
    sink = KafkaTransactionalSink(topic=out, transaction_timeout_ms=3_600_000)
    adapter = kafka_adapter(bootstrap, "p", sink)
    with pytest.raises(Exception, match="transaction.max.timeout.ms=900000"):
        adapter.check()
    assert group_id("p") == "airflow_eo.p"


def test_the_batch_is_read_once_and_a_bad_record_found_on_the_way_aborts_the_transaction(bootstrap, mysql_kwargs,
                                                                                       topic_name):
    """The job that computes the output for the driver's producer also counts the batch's records (no second read,
    no ``count`` phase); a bad record counted there (a value that is not UTF-8) fails the batch after the output was
    produced into the open transaction, which is aborted: a read_committed consumer sees none of it."""
    source, out = create_topic(bootstrap, topic_name, 2), create_topic(bootstrap, f"{topic_name}_out", 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        producer.produce(source, value=f"line {i}".encode(), partition=i % 2)
    producer.flush(30)
    op = KafkaMicroBatchOperator(task_id="counted", pipeline_id=f"p_{topic_name}", topics=[source],
                                 value_format="string", transform="SELECT value AS key, value FROM kafka_batch",
                                 sink=KafkaTransactionalSink(topic=out))
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (30, 30, 0)
    assert "count" not in summary["seconds"], summary["seconds"]  # counted by the job that computed the output
    assert len(read_topic(bootstrap, out)[0]) == 30

    for i in range(10):
        producer.produce(source, value=f"more {i}".encode(), partition=i % 2)
    producer.produce(source, value=b"\xff\xfe not UTF-8", partition=1)
    producer.flush(30)
    with pytest.raises(BadRecordError, match=r"1 bad record\(s\).*not valid UTF-8.*Nothing was committed"):
        run(op)
    assert len(read_topic(bootstrap, out)[0]) == 30, "the aborted transaction's records are not visible"
    assert len(read_topic(bootstrap, out, "read_uncommitted")[0]) == 40, "they were produced, then aborted"
    assert group_positions(bootstrap, op.pipeline_id, source) == {(source, 0): 15, (source, 1): 15}
    assert rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
                (op.pipeline_id,)) == [("committed",), ("planned",)]


def test_without_a_transform_the_parsed_records_are_produced_and_counted_in_one_job(bootstrap, mysql_kwargs,
                                                                                    topic_name):
    """No transform: the good parsed records go to the producer and the same job counts them and the bad ones
    (the plan's unfiltered records); a bad record fails the batch and its transaction is aborted."""
    source, out = create_topic(bootstrap, topic_name, 2), create_topic(bootstrap, f"{topic_name}_out", 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        producer.produce(source, value=json.dumps({"key": f"k{i}", "value": f"v{i}"}).encode(), partition=i % 2)
    producer.flush(30)
    op = KafkaMicroBatchOperator(task_id="plain", pipeline_id=f"p_{topic_name}", topics=[source],
                                 schema="key STRING, value STRING", sink=KafkaTransactionalSink(topic=out))
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"]) == (20, 20) and "count" not in summary["seconds"]
    assert sorted(read_topic(bootstrap, out)[0]) == sorted((f"k{i}".encode(), f"v{i}".encode()) for i in range(20))
    producer.produce(source, value=b"{not json", partition=0)
    producer.flush(30)
    with pytest.raises(BadRecordError, match=r"1 bad record\(s\).*malformed JSON"):
        run(op)
    assert len(read_topic(bootstrap, out)[0]) == 20
