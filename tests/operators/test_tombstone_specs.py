"""What ``on_tombstone="delete"`` refuses at DAG parse time, with the reason (no stack needed)."""

import pytest

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import (
    KafkaTransactionalSink,
    MySqlUpsertSink,
    MySqlXaSink,
    PostgresTwoPhaseSink,
    PostgresUpsertSink,
    sink_kind,
    spec_from_record,
)

SCHEMA = "id STRING NOT NULL, a STRING NOT NULL, n INT"


def op(sink, **kwargs):
    defaults = {"task_id": "mb", "topics": ["t"], "schema": SCHEMA, "key_format": "string", "sink": sink}
    return KafkaMicroBatchOperator(**{**defaults, **kwargs})


@pytest.mark.parametrize("upsert", [MySqlUpsertSink, PostgresUpsertSink])
def test_the_upsert_sinks_delete_by_the_kafka_key_without_a_transform(upsert):
    sink = upsert(table="t", key_columns=["id"], on_tombstone="delete")
    assert sink.delete_keys == ("id",) and sink.replay_safe and sink_kind(sink.kind).capabilities.deletes
    assert spec_from_record(sink.record()).delete_keys == ("id",)  # recorded for `airflow eo`
    op(sink)
    op(sink, mode="interval")  # replay-safe: a replayed interval deletes and writes the same rows
    assert upsert(table="t", key_columns=["id"]).delete_keys == ()  # default: a tombstone is a bad record
    with pytest.raises(ConfigurationError, match="without a transform only"):
        op(sink, transform="SELECT * FROM kafka_batch")
    with pytest.raises(ConfigurationError, match="from the Kafka key: set key_format"):
        op(sink, key_format="bytes")
    two = upsert(table="t", key_columns=["id", "a"], on_tombstone="delete")
    with pytest.raises(ConfigurationError, match="the key is one value, but the sink has 2 key columns"):
        op(two)
    op(two, key_format="json", key_schema="id STRING, a STRING")
    with pytest.raises(ConfigurationError, match="supported tombstone policies are bad_record, delete"):
        upsert(table="t", key_columns=["id"], on_tombstone="drop")


@pytest.mark.parametrize("sink", [
    lambda: MySqlXaSink(table="t", key_columns=["id"], on_tombstone="delete"),
    lambda: PostgresTwoPhaseSink(table="t", key_columns=["id"], on_tombstone="delete"),
    lambda: KafkaTransactionalSink(topic="out", on_tombstone="delete"),
])
def test_accumulating_sinks_and_the_kafka_sink_refuse_deletes_with_the_reason(sink):
    with pytest.raises(ConfigurationError, match="on_tombstone='delete' is not supported: .*(accumulate|appends)"):
        sink()
