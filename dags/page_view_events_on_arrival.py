"""Every page-view event once in ``page_view_events_on_arrival``, soon after it arrives: runs started by records,
not by a clock (Airflow 3's event-driven scheduling; docs/how-to/event-driven-runs.md).

The DAG is scheduled on an asset whose ``AssetWatcher`` runs ``EoBacklogTrigger`` in the triggerer: every second it
reads the pipeline's unfinished batches and committed offsets from the offset store and the end offsets of topic
``page_views`` (it commits nothing, joins no consumer group), and fires an asset event when 1,000 records wait that
no batch has planned yet, or the oldest of them is 10 s old. The event starts a run, which plans and commits, once,
everything that arrived by then; events queued while the DAG waits are consumed by that one run. The trigger fires
once per backlog: while the run is queued or running, more records start no more runs; when its batch commits,
what arrived meanwhile is the next backlog. A run that finds nothing new (started by hand, or by an event whose
records an earlier run took) commits an empty batch without starting Spark: a batch row with no ranges, the
offsets unchanged.

Interval mode is refused on this schedule (a run started by an asset event has no data interval), and Airflow
refuses backfills of an asset-scheduled DAG: backfill a pipeline on a time schedule (``page_view_events_hourly``).

The table is created by the task's ``on_execute_callback``, in the task's own process: a create task before it
would add its own start to every run's latency.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, Param

from airflow_eo.examples import page_views
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink
from airflow_eo.triggers.events import EoBacklogTrigger

PIPELINE = "page_view_events_on_arrival"

backlog = Asset(
    f"{PIPELINE}.backlog",
    watchers=[AssetWatcher(name=f"{PIPELINE}.backlog", trigger=EoBacklogTrigger(
        PIPELINE, [page_views.TOPIC], min_records=1_000, max_delay=timedelta(seconds=10),
        min_interval=timedelta(minutes=5), poll_interval=1.0,
        kafka_conn_id="kafka_default", offset_store_conn_id="eo_offset_store"))],
)



def create_table(context: Any) -> None:
    page_views.ensure_tables(EoMySqlHook("mysql_default").get_connect_kwargs())


with DAG(
    dag_id=PIPELINE,
    schedule=[backlog],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["airflow_eo", "example", "event-driven"],
    doc_md=__doc__,
    # Where Spark runs: "" = local[*] in the task; a manual run's conf may name a spark / spark_connect connection.
    params={"spark_conn_id": Param("", type="string", description="spark or spark_connect connection id")},
):
    KafkaMicroBatchOperator(
        task_id="store_page_view_events",
        pipeline_id=PIPELINE,
        topics=[page_views.TOPIC],
        value_format="json",
        schema=page_views.SCHEMA,
        sink=MySqlUpsertSink(table=page_views.ON_ARRIVAL, key_columns=["event_id"]),
        spark_conn_id="{{ params.spark_conn_id }}",
        retries=2,
        retry_delay=timedelta(seconds=10),
        on_execute_callback=create_table,
    )
