"""The write plan (``core.batch.WritePlan``): what the engine hands a sink decides how its writers run, whatever
DataFrame work the sink does. A sink that writes a projection of the output still takes part in the one pass and
its barrier vote: under ``on_bad_record="fail"`` nothing of the batch is visible when any record is bad."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from airflow_eo.core.batch import BatchContext, WritePlan, WriteResult
from airflow_eo.core.errors import BadRecordError
from airflow_eo.core.protocol import run_batch
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.mysql.sink import MySqlUpsertAdapter
from airflow_eo.sinks import MySqlUpsertSink
from examples.page_views import produce_page_views
from tests.support.kafka import create_topic
from tests.support.operator_harness import adapters, events_table, request, rows

PROJECTED = ["event_id", "app_id"]  # the events table's other columns are nullable


class ProjectingUpsert(MySqlUpsertAdapter):
    """An upsert sink that writes only some of the output's columns (a projection of the output)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plans: list[WritePlan] = []

    def write(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        self.plans.append(plan)
        return plan.run_partitions(self.partition_writer(batch, PROJECTED), PROJECTED)


def projecting_sink(table: str, bulk_load: bool) -> ProjectingUpsert:
    # The kind it is a variant of: its capabilities are that kind's (core.sink_kinds.KindAdapter).
    return ProjectingUpsert(EoMySqlHook().get_connect_kwargs(), name="MySqlUpsertSink", table=table,
                            key_columns=("event_id",), updates={}, rows_per_statement=500,
                            dead_letter_table="eo_dead_letter", bulk_load=bulk_load)


@pytest.mark.parametrize("bulk_load", [True, False], ids=["bulk_load-barrier", "statements-two_passes"])
def test_a_sink_writing_a_projection_makes_nothing_visible_when_a_record_is_bad(bulk_load, bootstrap, mysql_kwargs,
                                                                               topic_name):
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 400, topic=topic_name, raw_values=[b"{not json"])
    table = events_table(mysql_kwargs)
    pipeline = f"write_plan_{uuid.uuid4().hex[:8]}"
    roles = adapters(MySqlUpsertSink(table=table, key_columns=["event_id"]), pipeline)
    sink = projecting_sink(table, bulk_load)
    roles["sink"] = sink

    with pytest.raises(BadRecordError, match=r"1 bad record\(s\).*malformed JSON.*Nothing was committed"):
        run_batch(request(pipeline, topic_name, f"manual__{uuid.uuid4().hex}"), **roles)
    assert rows(mysql_kwargs, f"SELECT COUNT(*) FROM {table}")[0][0] == 0, "rows of a failed batch are visible"
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM eo_offset WHERE pipeline_id = %s", (pipeline,))[0][0] == 0
    if bulk_load:  # one pass: the projected writers counted the bad record and voted in a barrier stage
        [plan] = sink.plans
        assert plan.counts_bad_records and plan.vote
    else:  # the bad record was found by a first pass: the sink was never asked to write
        assert sink.plans == []


def test_a_sink_writing_a_projection_writes_those_columns_of_every_good_record(bootstrap, mysql_kwargs, topic_name):
    create_topic(bootstrap, topic_name, 2)
    events = produce_page_views(bootstrap, 300, topic=topic_name)
    table = events_table(mysql_kwargs)
    pipeline = f"write_plan_{uuid.uuid4().hex[:8]}"
    roles = adapters(MySqlUpsertSink(table=table, key_columns=["event_id"]), pipeline)
    roles["sink"] = projecting_sink(table, bulk_load=True)
    summary = run_batch(request(pipeline, topic_name, f"manual__{uuid.uuid4().hex}"), **roles)
    assert (summary.records_in, summary.rows_out) == (300, 300)
    written = rows(mysql_kwargs, f"SELECT event_id, app_id, user_id, ts FROM {table}")
    assert {(r[0], r[1]) for r in written} == {(e["event_id"], e["app_id"]) for e in events}
    assert {(r[2], r[3]) for r in written} == {(None, None)}  # the columns it left out
