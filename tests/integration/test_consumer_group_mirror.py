"""Lag where on-call already looks: after every committed batch the store's offsets are mirrored into the Kafka group
``airflow_eo.<pipeline_id>`` (kafka-consumer-groups, Burrow and the exporters compute lag from a group's committed
offsets). Read back here with Kafka's Admin API, as those tools read it; never read back by the pipeline."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from airflow_eo.core.rewind import RewindKind, RewindTarget
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.kafka.offsets import KafkaOffsetSource, group_id
from airflow_eo.sinks import MySqlUpsertSink, PostgresUpsertSink
from examples.page_views import produce_page_views
from tests.support.kafka import create_topic
from tests.support.operator_harness import events_table, operator, run
from tests.support.page_views import committed_offsets
from tests.support.postgres import EVENTS_DDL, pg_table


def group_offsets(bootstrap: str, pipeline_id: str, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    """The group's committed offsets, as a lag tool reads them (the Admin API's OffsetFetch)."""
    wanted = [TopicPartition(topic, p) for p in range(partitions)]
    request = [ConsumerGroupTopicPartitions(group_id(pipeline_id), wanted)]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer: a collected client never answers
    answered = next(iter(admin.list_consumer_group_offsets(request, request_timeout=30).values())).result(timeout=60)
    return {(tp.topic, tp.partition): tp.offset for tp in answered.topic_partitions or [] if tp.offset >= 0}


def topic_end(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    source = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    return source.last_stable(source.partitions([topic]))


def test_every_batch_of_a_mysql_pipeline_empty_ones_too_moves_its_group_and_a_rewind_moves_it_back(
        bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 3)
    produce_page_views(bootstrap, 60, topic=topic_name)
    op = operator(topic_name, MySqlUpsertSink(table=events_table(mysql_kwargs), key_columns=["event_id"]))
    run(op)
    ends = topic_end(bootstrap, topic_name)
    assert committed_offsets(mysql_kwargs, op.pipeline_id) == {p: o for (_, p), o in ends.items()}
    assert group_offsets(bootstrap, op.pipeline_id, topic_name, 3) == ends

    assert run(op)["records_in"] == 0  # an empty batch commits the same offsets again (renewing their expiry)
    assert group_offsets(bootstrap, op.pipeline_id, topic_name, 3) == ends

    produce_page_views(bootstrap, 30, topic=topic_name)
    run(op)
    moved = topic_end(bootstrap, topic_name)
    assert moved != ends and group_offsets(bootstrap, op.pipeline_id, topic_name, 3) == moved

    report = pipeline_operations(actor="tester@here").rewind(
        op.pipeline_id, RewindTarget(RewindKind.OFFSETS, offsets={(topic_name, 0): 0}), apply=True,
        reason="replay partition 0")
    assert report.applied and report.notes == []
    assert group_offsets(bootstrap, op.pipeline_id, topic_name, 3) == {**moved, (topic_name, 0): 0}


def test_a_postgres_pipelines_batches_move_its_group(bootstrap, postgres_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 40, topic=topic_name)
    table = pg_table(postgres_kwargs, EVENTS_DDL, "mirror")
    op = operator(topic_name, PostgresUpsertSink(table=table, key_columns=["event_id"]))
    run(op)
    assert group_offsets(bootstrap, op.pipeline_id, topic_name, 2) == topic_end(bootstrap, topic_name)


def test_a_mirror_that_fails_never_fails_the_committed_batch(bootstrap, mysql_kwargs, topic_name, capfd):
    """A consumer that joined the group (someone reusing the name) makes the broker refuse offsets from outside the
    group: the batch is committed all the same, with a warning, and the group keeps its member's offsets."""
    create_topic(bootstrap, topic_name, 1)
    produce_page_views(bootstrap, 20, topic=topic_name)
    op = operator(topic_name, MySqlUpsertSink(table=events_table(mysql_kwargs), key_columns=["event_id"]),
                  pipeline_id=f"mirror_busy_{uuid.uuid4().hex[:6]}")
    member: Any = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id(op.pipeline_id),
                            "enable.auto.commit": False, "session.timeout.ms": 45000})
    member.subscribe([topic_name])
    try:
        for _ in range(60):  # until the member has joined (it has an assignment)
            member.poll(0.5)
            if member.assignment():
                break
        assert member.assignment(), "the member never joined its group"
        capfd.readouterr()
        summary = run(op)
        assert summary["records_in"] == 20
        assert committed_offsets(mysql_kwargs, op.pipeline_id) == {0: 20}
        logged = capfd.readouterr().out  # the task logger writes there
        assert f"the consumer group {group_id(op.pipeline_id)} still shows the offsets before this batch" in logged
        assert "UNKNOWN_MEMBER_ID" in logged
        assert group_offsets(bootstrap, op.pipeline_id, topic_name, 1) == {}
    finally:
        member.close()
