"""Reusing the operator across DAGs: dags/page_view_events_by_region.py (a factory and a mapped task)."""

from __future__ import annotations

import os
from datetime import datetime

import pytest
from airflow.sdk import DAG

from airflow_eo.core.errors import PipelineConflictError
from airflow_eo.sinks import MySqlUpsertSink
from examples.page_views import produce_page_views
from examples.topics import read_topic
from tests.support import fork_server
from tests.support.children import output_within, why
from tests.support.operator_harness import events_table, operator, rows, run
from tests.support.page_views import REPO, committed_offsets, run_dag

REGIONS = ("eu", "us")


def region_truth(bootstrap: str) -> tuple[set[str], dict[str, dict[int, int]]]:
    """Event ids of both regional topics and each topic's end offsets, read straight from Kafka."""
    import json

    ids: set[str] = set()
    ends = {}
    for region in REGIONS:
        records, ends[region] = read_topic(bootstrap, f"page_views_{region}")
        ids |= {json.loads(value)["event_id"] for _, value in records}
    return ids, ends


def test_two_dags_from_one_factory_run_concurrently_and_a_mapped_task_reads_both(bootstrap, mysql_kwargs,
                                                                                 airflow_db):
    for region in REGIONS:
        produce_page_views(bootstrap, 400, f"page_views_{region}")
    # Both factory DAGs at the same time, as the scheduler would run them.
    children = [fork_server.start([str(REPO / "scripts" / "run_dag.py"), f"page_view_events_{r}"], os.environ,
                                  stderr_to_stdout=True) for r in REGIONS]
    outputs = [output_within(child, 900, python_stacks=True) for child in children]
    assert [child.returncode for child in children] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    ids, ends = region_truth(bootstrap)
    stored = {r[0] for r in rows(mysql_kwargs, "SELECT event_id FROM page_view_events_regional")}
    assert stored == ids
    for region in REGIONS:
        assert committed_offsets(mysql_kwargs, f"page_view_events_{region}") == ends[region]

    mapped = run_dag("page_view_events_mapped")
    assert mapped.returncode == 0, why(mapped)
    for region in REGIONS:  # each mapped instance is its own pipeline, named after its topics
        pipeline = f"page_view_events_mapped.store_events.page_views_{region}"
        assert committed_offsets(mysql_kwargs, pipeline) == ends[region]
    assert {r[0] for r in rows(mysql_kwargs, "SELECT event_id FROM page_view_events_regional")} == ids


def test_the_same_pipeline_id_in_a_second_dag_is_refused_naming_both(bootstrap, mysql_kwargs, topic_name):
    produce_page_views(bootstrap, 20, topic_name)
    sink = MySqlUpsertSink(table=events_table(mysql_kwargs), key_columns=["event_id"])
    with DAG("first_dag", schedule=None, start_date=datetime(2026, 1, 1)):
        first = operator(topic_name, sink, pipeline_id=f"shared_{topic_name}")
    with DAG("second_dag", schedule=None, start_date=datetime(2026, 1, 1)):
        second = operator(topic_name, sink, pipeline_id=f"shared_{topic_name}")
    assert run(first)["records_in"] == 20
    with pytest.raises(PipelineConflictError,
                       match="belongs to DAG 'first_dag' task 'micro_batch', and DAG 'second_dag' task 'micro_batch'"):
        run(second)
    produce_page_views(bootstrap, 5, topic_name)
    assert run(first)["records_in"] == 5  # the refused run took nothing from the first DAG
