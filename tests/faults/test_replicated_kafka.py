"""A replicated Kafka cluster losing a partition leader and the transaction coordinator mid-batch.

Three KRaft nodes on loopback (``scripts/stack.py kafka-cluster up``), topics and the transaction
state log replicated three times with ``min.insync.replicas=2``. The node leading an input partition
(while Spark reads it) and the node coordinating the pipeline's Kafka transaction (while the sink
produces into it) are SIGKILLed and started again by a supervisor. Each batch commits exactly once or
fails and is retried; the sinks end equal to the ground truth, and a read_committed consumer of the
Kafka sink's output never sees a batch's record twice.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from types import ModuleType

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from airflow_eo.kafka.sink import transactional_id
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import KafkaTransactionalSink, MySqlXaSink
from examples import ip_counts, page_views
from tests.support.faults import Faults, Supervisor, check_end_state, check_kafka_sink_end_state, gone
from tests.support.operator_harness import counts_table, run

CONN = "kafka_replicated"


@pytest.fixture(scope="module")
def cluster(stack: ModuleType) -> Iterator[str]:
    bootstrap = stack.kafka_cluster_up()
    yield bootstrap
    stack.kafka_cluster_down()


@pytest.fixture
def replicated(cluster: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}",
                       json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": cluster}}))
    return cluster


def replicated_topic(bootstrap: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, 3, 3, config={"min.insync.replicas": "2"})]).values():
        future.result()
    return name


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic] \
        .partitions[partition].leader


def transaction_coordinator(bootstrap: str, pipeline_id: str) -> int:
    """The node leading the ``__transaction_state`` partition of the pipeline's transactional id
    (Kafka's rule: Java's ``String.hashCode`` of the id, non-negative, modulo the 50 partitions)."""
    h = 0
    for unit in transactional_id(pipeline_id).encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return leader_of(bootstrap, "__transaction_state", (h & 0x7FFFFFFF) % 50)


def kill_node_at(stack: ModuleType, faults: Faults, point: str, node: int, op: KafkaMicroBatchOperator,
                 run_id: str) -> None:
    """Run an attempt whose ``point`` SIGKILLs cluster node ``node``; a supervisor starts it again."""
    service = f"kafka-node-{node}"
    pid = stack.pid_alive(stack.pid_file_of(service))
    with Supervisor(stack, service) as supervisor, faults.kill_at(point, stack.pid_file_of(service)):
        try:
            run(op, run_id)
        except Exception as exc:  # may fail; the next attempts must leave the sink exact
            print(f"{point} with node {node} killed: the attempt failed: {exc!r}"[:400])
        if gone(pid):
            supervisor.wait_for_restart()
    assert gone(pid) and supervisor.restarts == 1, f"{point}: node {node} was not killed and restarted"


def test_the_leader_of_an_input_partition_dies_while_spark_reads_it(stack, faults, replicated, mysql_kwargs):
    topic = replicated_topic(replicated, f"r_{uuid.uuid4().hex[:10]}")
    page_views.produce_page_views(replicated, 6000, topic=topic)
    table = counts_table(mysql_kwargs)
    op = KafkaMicroBatchOperator(task_id="micro_batch", pipeline_id=f"p_{topic}", topics=[topic],
                                 schema=page_views.SCHEMA, transform=page_views.count_per_app, kafka_conn_id=CONN,
                                 sink=MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"}))
    run_id = f"manual__{uuid.uuid4().hex}"
    kill_node_at(stack, faults, "during_write", leader_of(replicated, topic, 0), op, run_id)
    page_views.produce_page_views(replicated, 500, topic=topic)
    run(op, run_id)  # the same run again
    page_views.produce_page_views(replicated, 500, topic=topic)
    run(op)
    check_end_state("xa", table, op.pipeline_id, replicated, topic, mysql_kwargs, mysql_kwargs)


def test_the_transaction_coordinator_and_a_leader_die_while_the_kafka_sink_produces(stack, faults, replicated,
                                                                                    mysql_kwargs):
    source = replicated_topic(replicated, f"r_{uuid.uuid4().hex[:10]}")
    out = replicated_topic(replicated, f"{source}_out")
    op = KafkaMicroBatchOperator(task_id="count_ips", pipeline_id=f"p_{source}", topics=[source],
                                 value_format="string", transform=ip_counts.count_per_window_and_ip,
                                 kafka_conn_id=CONN, sink=KafkaTransactionalSink(topic=out, conn_id=CONN))
    ip_counts.produce_lines(replicated, 1000, topic=source)
    run(op)  # a first batch: the pipeline's transactional id gets its coordinator
    for point, node in (("mid_produce", transaction_coordinator(replicated, op.pipeline_id)),
                        ("after_kafka_commit", transaction_coordinator(replicated, op.pipeline_id)),
                        ("mid_produce", leader_of(replicated, source, 1))):
        ip_counts.produce_lines(replicated, 4000, topic=source)
        run_id = f"manual__{uuid.uuid4().hex}"
        kill_node_at(stack, faults, point, node, op, run_id)
        run(op, run_id)  # the same run again: commits, or returns the batch it committed
    ip_counts.produce_lines(replicated, 500, topic=source)
    run(op)

    check_kafka_sink_end_state(replicated, source, out, op, mysql_kwargs)
