"""OpenLineage of a micro-batch on real runs: the topics in and the sink out in OpenLineage's naming, the batch as a
run facet of ours (pipeline, batch, offset ranges, counts) and the rows written as ``outputStatistics`` on COMPLETE;
on FAIL, where the store holds the run's batch. Serialized as the provider's transports send them."""

from __future__ import annotations

import json

import pytest
from openlineage.client.serde import Serde

from airflow_eo.core.errors import BadRecordError
from airflow_eo.sinks import MySqlUpsertSink, PostgresUpsertSink
from examples.page_views import produce_page_views
from tests.support.bad_records import BAD_VALUES
from tests.support.kafka import create_topic
from tests.support.operator_harness import events_table, operator, run
from tests.support.postgres import EVENTS_DDL, pg_table


def as_sent(facet: object) -> dict:
    """The facet as a transport writes it (the client's own serializer)."""
    return json.loads(Serde.to_json(facet))


def test_a_committed_batch_names_its_offsets_counts_and_rows_written(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 30, topic=topic_name)
    table = events_table(mysql_kwargs)
    op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]))
    summary = run(op)
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [(f"kafka://{bootstrap}", topic_name)]
    [output] = lineage.outputs
    assert (output.namespace, output.name) == (f"mysql://{mysql_kwargs['host']}:{mysql_kwargs['port']}",
                                               f"{mysql_kwargs['database']}.{table}")
    assert as_sent(output.outputFacets["outputStatistics"])["rowCount"] == 30
    batch = as_sent(lineage.run_facets["airflowEoBatch"])
    assert (batch["pipeline"], batch["batchId"], batch["state"], batch["recordsIn"], batch["rowsOut"],
            batch["deadLetters"]) == (op.pipeline_id, summary["batch_id"], "committed", 30, 30, 0)
    assert sorted((r["partition"], r["fromOffset"], r["untilOffset"]) for r in batch["ranges"]) == sorted(
        (r["partition"], r["from_offset"], r["until_offset"]) for r in summary["ranges"])
    assert sum(r["untilOffset"] - r["fromOffset"] for r in batch["ranges"]) == 30


def test_a_failed_batch_says_where_the_store_holds_it(bootstrap, postgres_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 1)
    produce_page_views(bootstrap, 10, topic=topic_name, raw_values=BAD_VALUES)
    table = pg_table(postgres_kwargs, EVENTS_DDL, "lineage")
    op = operator(topic_name, PostgresUpsertSink(table=table, key_columns=["event_id"]))  # on_bad_record="fail"
    with pytest.raises(BadRecordError):
        run(op)
    lineage = op.get_openlineage_facets_on_failure(None)
    [output] = lineage.outputs
    assert (output.namespace, output.name) == (f"postgres://{postgres_kwargs['host']}:{postgres_kwargs['port']}",
                                               f"{postgres_kwargs['dbname']}.public.{table}")
    batch = as_sent(lineage.run_facets["airflowEoBatch"])
    assert batch["pipeline"] == op.pipeline_id and batch["state"] in ("planned", "aborted"), batch
    assert [(r["topic"], r["fromOffset"], r["untilOffset"]) for r in batch["ranges"]] == [
        (topic_name, 0, 10 + len(BAD_VALUES))]
