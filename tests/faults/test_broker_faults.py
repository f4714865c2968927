"""The Kafka broker SIGKILLed mid-batch and started again by a supervisor while the batch goes on.

During the Spark read (XA per-app counts: a lost or doubled record shows in the counts), while the
Kafka transactional sink produces into its open transaction, and between its ``commit_transaction``
and the offset store's mirror of it. The attempt either completes or fails; the same run again,
more input and a later run leave the sink equal to the ground truth, and a read_committed consumer
of the Kafka sink's output never sees a batch's record twice.
"""

from __future__ import annotations

import time
import uuid
from types import ModuleType

from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import KafkaTransactionalSink, MySqlXaSink
from examples import ip_counts, page_views
from tests.support.faults import Faults, Supervisor, check_end_state, check_kafka_sink_end_state, gone, store_rows
from tests.support.kafka import create_topic
from tests.support.operator_harness import counts_table, operator, run

ATTEMPT_SECONDS = 180  # a broker back within seconds: reads and transactions go on or fail, never hang


def attempt(op: KafkaMicroBatchOperator, run_id: str) -> BaseException | None:
    started = time.monotonic()
    try:
        run(op, run_id)
        error = None
    except Exception as exc:  # the attempt may fail: what matters is what the next ones leave
        error = exc
    seconds = time.monotonic() - started
    assert seconds < ATTEMPT_SECONDS, f"the attempt hung: {error!r}"
    print(f"attempt {run_id}: {seconds:.1f}s, {'completed' if error is None else f'failed: {error!r}'[:300]}")
    return error


def test_the_broker_crashing_during_the_spark_read(stack: ModuleType, faults: Faults, bootstrap, mysql_kwargs,
                                                    topic_name):
    create_topic(bootstrap, topic_name, 3)
    page_views.produce_page_views(bootstrap, 6000, topic=topic_name)
    table = counts_table(mysql_kwargs)
    op = operator(topic_name, MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"}),
                  transform=page_views.count_per_app)
    broker = stack.pid_alive(stack.PID_FILES["kafka"])
    run_id = f"manual__{uuid.uuid4().hex}"
    with Supervisor(stack, "kafka") as supervisor, faults.kill_at("during_write", stack.PID_FILES["kafka"]):
        attempt(op, run_id)
    assert gone(broker) and supervisor.restarts == 1, "the broker was not killed and restarted during the read"
    page_views.produce_page_views(bootstrap, 500, topic=topic_name)
    run(op, run_id)  # the same run again
    page_views.produce_page_views(bootstrap, 500, topic=topic_name)
    run(op)  # a later run
    check_end_state("xa", table, op.pipeline_id, bootstrap, topic_name, mysql_kwargs, mysql_kwargs)


def test_the_broker_crashing_while_the_kafka_sink_produces_and_commits(stack: ModuleType, faults: Faults,
                                                                       bootstrap, mysql_kwargs, topic_name):
    source, out = create_topic(bootstrap, topic_name, 3), create_topic(bootstrap, f"{topic_name}_out", 3)
    ip_counts.produce_lines(bootstrap, 4000, topic=source)
    op = KafkaMicroBatchOperator(task_id="count_ips", pipeline_id=f"p_{topic_name}", topics=[source],
                                 value_format="string", transform=ip_counts.count_per_window_and_ip,
                                 sink=KafkaTransactionalSink(topic=out))
    run_id = f"manual__{uuid.uuid4().hex}"
    for step in ("mid_produce", "after_kafka_commit"):
        if store_rows(mysql_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s AND run_id = %s",
                      (op.pipeline_id, run_id)) == [("committed",)]:
            run_id = f"manual__{uuid.uuid4().hex}"
        broker = stack.pid_alive(stack.PID_FILES["kafka"])
        with Supervisor(stack, "kafka") as supervisor, faults.kill_at(step, stack.PID_FILES["kafka"]):
            attempt(op, run_id)
        assert gone(broker) and supervisor.restarts == 1, f"{step}: the broker was not killed and restarted"
        ip_counts.produce_lines(bootstrap, 1500, topic=source)
    run(op, run_id)  # the same run again
    ip_counts.produce_lines(bootstrap, 500, topic=source)
    run(op)  # a later run

    check_kafka_sink_end_state(bootstrap, source, out, op, mysql_kwargs)
