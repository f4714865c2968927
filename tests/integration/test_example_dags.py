"""End to end: the example DAGs under dag.test(), several runs with new events between them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from examples.page_views import TOPIC, ground_truth, produce_page_views
from examples.state import forget_pipelines, pg_prepared_transactions, reset_page_views_pg
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.lineage import assert_batch_lineage, completes, file_transport
from tests.support.page_views import (
    UPSERT_PIPELINE,
    XA_PIPELINE,
    assert_contiguous,
    assert_exactly_once,
    batch_rows,
    committed_offsets,
    reset,
    run_dag,
)


@pytest.mark.parametrize(("dag_id", "pipeline", "task", "table"), [
    ("page_views_xa", XA_PIPELINE, "count_page_views", "app_pv"),
    ("page_view_events_upsert", UPSERT_PIPELINE, "store_page_view_events", "page_view_events")])
def test_several_runs_with_new_events_between_them(dag_id, pipeline, task, table, bootstrap, mysql_kwargs, airflow_db,
                                                    tmp_path):
    reset(mysql_kwargs, pipeline)
    produce_page_views(bootstrap, 500)
    lineage = tmp_path / "openlineage.json"
    for new_events in (300, 0, 0):  # new events, then none: the third run finds nothing to read
        done = run_dag(dag_id, env=file_transport(lineage))
        assert done.returncode == 0, why(done)
        assert_exactly_once(mysql_kwargs, bootstrap, pipeline)
        if new_events:
            produce_page_views(bootstrap, new_events)
    batches = batch_rows(mysql_kwargs, pipeline)
    assert [b["state"] for b in batches] == ["committed"] * 3
    # The run with no new events committed an empty batch (offsets unchanged).
    assert all(r["from_offset"] == r["until_offset"] for r in batches[2]["ranges"])
    # Each run's COMPLETE event, as Airflow's OpenLineage provider sent it through its file transport.
    sent = completes(lineage, f"{dag_id}.{task}")
    assert len(sent) == 3
    facets = [assert_batch_lineage(e, [(f"kafka://{bootstrap}", TOPIC)],
                                   (f"mysql://{mysql_kwargs['host']}:{mysql_kwargs['port']}",
                                    f"{mysql_kwargs['database']}.{table}"), pipeline) for e in sent]
    assert [f["batchId"] for f in facets] == [b["batch_id"] for b in batches]
    assert facets[0]["recordsIn"] >= 500 and [f["recordsIn"] for f in facets[1:]] == [300, 0]  # the shared topic


def test_cleared_committed_run_returns_its_summary_and_does_nothing(bootstrap, mysql_kwargs, airflow_db):
    reset(mysql_kwargs, XA_PIPELINE)
    produce_page_views(bootstrap, 100)
    logical_date = datetime.now(timezone.utc)
    first = run_dag("page_views_xa", logical_date)
    assert first.returncode == 0, why(first)
    truth = assert_exactly_once(mysql_kwargs, bootstrap, XA_PIPELINE)
    produce_page_views(bootstrap, 50)
    again = run_dag("page_views_xa", logical_date)  # same logical date = the same run, cleared
    assert again.returncode == 0, why(again)
    assert "already committed" in again.stdout + again.stderr
    assert len(batch_rows(mysql_kwargs, XA_PIPELINE)) == 1
    from tests.support.page_views import sink_state

    assert sink_state(mysql_kwargs)[0] == truth.pv_per_app  # the 50 new events wait for the next run


def test_the_postgres_examples_store_each_event_once_all_on_postgres(bootstrap, postgres_kwargs, airflow_db, tmp_path):
    """The two-phase sink (``page_views_pg``) and the upsert sink (``page_view_events_pg``), each with its offset
    store in the same PostgreSQL database; both DAGs in one ``dag.test()`` process (one Spark session)."""
    reset_page_views_pg(postgres_kwargs)
    reset_page_views_pg(postgres_kwargs, "page_view_events_pg", table="page_view_events")
    produce_page_views(bootstrap, 400)
    lineage = tmp_path / "openlineage.json"
    done = run_dag("page_views_pg,page_view_events_pg", env=file_transport(lineage))  # one run each
    assert done.returncode == 0, why(done)
    namespace = f"postgres://{postgres_kwargs['host']}:{postgres_kwargs['port']}"
    [counted] = completes(lineage, "page_views_pg.count_page_views")
    assert_batch_lineage(counted, [(f"kafka://{bootstrap}", TOPIC)],
                         (namespace, f"{postgres_kwargs['dbname']}.public.app_pv"), "page_views_pg")
    [stored] = completes(lineage, "page_view_events_pg.store_page_view_events")
    facet = assert_batch_lineage(stored, [(f"kafka://{bootstrap}", TOPIC)],
                                 (namespace, f"{postgres_kwargs['dbname']}.public.page_view_events"),
                                 "page_view_events_pg")
    pv_per_app, event_ids, ends = ground_truth(bootstrap, TOPIC)
    assert {r["partition"]: r["untilOffset"] for r in facet["ranges"]} == ends  # the whole topic, in one batch
    with psycopg.connect(**postgres_kwargs) as conn:
        assert dict(conn.execute("SELECT app_id, pv FROM app_pv").fetchall()) == pv_per_app
        assert {r[0] for r in conn.execute("SELECT event_id FROM page_view_events").fetchall()} == event_ids
        for pipeline in ("page_views_pg", "page_view_events_pg"):
            assert dict(conn.execute("SELECT kafka_partition, next_offset FROM eo_offset WHERE pipeline_id = %s",
                                     (pipeline,)).fetchall()) == ends
            assert conn.execute("SELECT state FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
                                (pipeline,)).fetchall() == [("committed",)]
    assert pg_prepared_transactions(postgres_kwargs, "page_views_pg") == []


def lakehouse_rows(dag_id: str, location: Path) -> list[dict]:
    """The table read back without Spark: delta-rs for Delta, pyiceberg for Iceberg."""
    if dag_id == "page_views_delta":
        from deltalake import DeltaTable

        return DeltaTable(str(location)).to_pyarrow_table().to_pylist()
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(str(location)).scan().to_arrow().to_pylist()


@pytest.mark.parametrize(("dag_id", "table"), [("page_views_delta", "delta/page_view_events"),
                                               ("page_views_iceberg", "iceberg/events/page_view_events")])
def test_the_lakehouse_examples_append_each_event_once(dag_id, table, bootstrap, mysql_kwargs, airflow_db, tmp_path):
    """``dags/page_views_lakehouse.py``: one run of each DAG into a lakehouse of the test's own; the COMPLETE event
    names the table by its location (OpenLineage's naming: ``file`` + the path), an Iceberg table also by its name in
    the Hadoop catalog (``symlinks``)."""
    forget_pipelines(mysql_kwargs, dag_id)
    produce_page_views(bootstrap, 200)
    lake, lineage = tmp_path / "lake", tmp_path / "openlineage.json"
    done = run_dag(dag_id, env={**file_transport(lineage), "AIRFLOW_EO_LAKEHOUSE": str(lake)})
    assert done.returncode == 0, why(done)
    _, event_ids, ends = ground_truth(bootstrap, TOPIC)
    location = lake / table
    written = [r["event_id"] for r in lakehouse_rows(dag_id, location)]
    assert len(written) == len(set(written)) and set(written) == event_ids
    assert committed_offsets(mysql_kwargs, dag_id) == ends
    assert_contiguous(batch_rows(mysql_kwargs, dag_id))
    [sent] = completes(lineage, f"{dag_id}.store_page_view_events")
    facet = assert_batch_lineage(sent, [(f"kafka://{bootstrap}", TOPIC)], ("file", str(location)), dag_id)
    assert {r["partition"]: r["untilOffset"] for r in facet["ranges"]} == ends
    assert facet["rowsOut"] == len(written)
    [output] = sent["outputs"]
    assert output["facets"]["storage"]["storageLayer"] == dag_id.rpartition("_")[2]
    symlinks = output["facets"].get("symlinks", {}).get("identifiers")
    assert symlinks == (None if dag_id == "page_views_delta" else
                        [{"namespace": f"file:{lake}/iceberg", "name": "events.page_view_events", "type": "TABLE"}])


def test_the_lag_alert_fires_on_a_pipeline_whose_oldest_record_waits_too_long(bootstrap, airflow_db, topic_name):
    """``dags/page_views_lag_alert.py`` pointed (by the run's conf) at a pipeline that never ran on a topic whose
    records are 2 hours old: the deferrable sensor's first look finds the oldest unprocessed record past 30 minutes
    (5 records, far under 100,000), succeeds, and its ``PipelineLagNotifier`` says how far behind it is."""
    create_topic(bootstrap, topic_name, 1)
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    produce_page_views(bootstrap, 0, topic_name, timestamps=[start + timedelta(seconds=s) for s in range(5)])
    pipeline = f"p_{topic_name}"
    done = run_dag("page_views_lag_alert", conf={"pipeline_id": pipeline, "topic": topic_name})
    assert done.returncode == 0, why(done)
    said = re.search(rf"airflow_eo: pipeline {pipeline} is behind: 5 records wait, the oldest (\d+) s old \(alert at "
                     rf"100000 records or a record 1800 s old\); most behind: {topic_name}\[0\]=5",
                     done.stdout + done.stderr)
    assert said is not None, why(done)
    assert 7200 <= int(said.group(1)) < 7200 + 300
