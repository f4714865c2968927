"""Run the micro-batch operator (or the protocol with its real adapters) on a test's own topic and table."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pymysql

from airflow_eo.core.batch import RunRequest
from airflow_eo.core.config import ParseConfig
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import OffsetStoreHook
from airflow_eo.hooks.spark import SparkSessionHook
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink
from airflow_eo.spark.engine import SparkBatchEngine
from examples import page_views


def example_table(mysql_kwargs: dict[str, Any], example: str) -> str:
    """A fresh table shaped like the example table ``example`` (``page_view_events`` or ``app_pv``)."""
    return page_views.create_table_like(mysql_kwargs, example, f"{example[:8]}_{uuid.uuid4().hex[:8]}")


def events_table(mysql_kwargs: dict[str, Any]) -> str:
    return example_table(mysql_kwargs, "page_view_events")


def counts_table(mysql_kwargs: dict[str, Any]) -> str:
    return example_table(mysql_kwargs, "app_pv")


def operator(topic: str, sink: MySqlUpsertSink, pipeline_id: str | None = None,
             **kwargs: Any) -> KafkaMicroBatchOperator:
    # One task id: every harness operator is the same "owner" of its pipeline (a retry, a later run).
    kwargs.setdefault("schema", page_views.SCHEMA)
    return KafkaMicroBatchOperator(task_id="micro_batch", pipeline_id=pipeline_id or f"p_{topic}",
                                   topics=[topic], sink=sink, **kwargs)


def run(op: KafkaMicroBatchOperator, run_id: str | None = None,
        interval: tuple[datetime, datetime] | None = None) -> dict[str, Any]:
    context: dict[str, Any] = {"run_id": run_id or f"manual__{uuid.uuid4().hex}"}
    if interval is not None:
        context.update(data_interval_start=interval[0], data_interval_end=interval[1])
    return op.execute(context)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One operator run described as JSON-able data (``tests.support.operator_child``'s argument): ``topic``,
    ``pipeline_id``, ``run_id``, ``sink`` (a registered kind's name and its options), and optional ``transform``,
    ``offset_store_conn_id``, ``options`` (more operator options) and ``interval`` (``[start, end]`` in ISO 8601).
    A crash test kills a child running it; the runs that must simply succeed (a retry after the kill, a later run)
    run it in the test's own process, whose Spark session is warm (a child pays ~15 s for its Python and JVM)."""
    from airflow_eo.sinks import SINK_KINDS

    sink = dict(job["sink"])
    spec = SINK_KINDS[sink.pop("kind")](**sink)
    options = {k: job[k] for k in ("transform", "offset_store_conn_id") if job.get(k)}
    options.update(job.get("options") or {})  # other operator options (key_format, schema, on_bad_record, ..)
    interval = job.get("interval")
    return run(operator(job["topic"], spec, pipeline_id=job["pipeline_id"], **options), run_id=job["run_id"],
               interval=None if interval is None else (datetime.fromisoformat(interval[0]),
                                                       datetime.fromisoformat(interval[1])))


def adapters(sink: MySqlUpsertSink, pipeline_id: str, transform: Any = None,
             parse: ParseConfig | None = None) -> dict[str, Any]:
    """The operator's real adapters, for tests that drive ``run_batch`` step by step."""
    kafka = KafkaClusterHook("kafka_default")
    return {
        "store": OffsetStoreHook().get_store(),
        "source": kafka.get_offset_source(),
        "engine": SparkBatchEngine(SparkSessionHook().get_conn, kafka.get_config(),
                                   parse or ParseConfig(schema=page_views.SCHEMA), transform=transform),
        "sink": build_sink(sink, pipeline_id, "eo_offset_store"),
    }


def request(pipeline_id: str, topic: str, run_id: str) -> RunRequest:
    return RunRequest(pipeline_id=pipeline_id, run_id=run_id, topics=[topic])


def rows(mysql_kwargs: dict[str, Any], sql: str, args: tuple = ()) -> list[tuple]:
    conn = pymysql.connect(**mysql_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()
