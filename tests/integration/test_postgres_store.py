"""The offset store on PostgreSQL under the real operator: a ``postgres`` store connection with the MySQL sinks
(real Kafka, Spark, MariaDB and PostgreSQL), and ``airflow eo``'s reads of it."""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest

from airflow_eo.core.stores import store_for
from airflow_eo.hooks.connected_sinks import AirflowConnectionResolver
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.mysql.database import DATABASE as MYSQL
from airflow_eo.postgres.database import DATABASE as POSTGRES
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink
from examples.page_views import ground_truth, produce_page_views
from examples.state import our_prepared_branches
from tests.support.kafka import create_topic
from tests.support.operator_harness import counts_table, events_table, operator, rows, run

PG_STORE = "eo_pg_store"


@pytest.fixture
def pg_store(monkeypatch, postgres_kwargs) -> str:
    """The connection id of an offset store on the stack's PostgreSQL (an Airflow ``postgres`` connection)."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    return PG_STORE


def pg_rows(postgres_kwargs, sql: str, args: tuple = ()) -> list[tuple]:
    with psycopg.connect(**postgres_kwargs, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def test_the_store_connections_type_chooses_postgres(pg_store):
    store = OffsetStoreHook(pg_store).get_store()
    assert store.database is POSTGRES
    assert store_for(AirflowConnectionResolver().connection("eo_offset_store")).database is MYSQL


@pytest.mark.parametrize("kind", ["xa", "upsert"])
def test_mysql_sinks_with_the_offset_store_on_postgres_write_each_event_once(kind, pg_store, bootstrap,
                                                                               mysql_kwargs, postgres_kwargs):
    topic = f"pg_store_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 3)
    sink = (MySqlXaSink(table=counts_table(mysql_kwargs), key_columns=["app_id"], updates={"pv": "add"})
            if kind == "xa" else MySqlUpsertSink(table=events_table(mysql_kwargs), key_columns=["event_id"]))
    transform = "airflow_eo.examples.page_views.count_per_app" if kind == "xa" else None
    op = operator(topic, sink, pipeline_id=f"pg_store_{kind}_{topic}", offset_store_conn_id=pg_store,
                  **({"transform": transform} if transform else {}))
    produce_page_views(bootstrap, 500, topic=topic)
    first = run(op)
    produce_page_views(bootstrap, 300, topic=topic)
    second = run(op)
    assert (first["records_in"], second["records_in"]) == (500, 300)

    pv_per_app, event_ids, ends = ground_truth(bootstrap, topic)  # read from the topic, not by airflow_eo
    if kind == "xa":
        assert {app: int(pv) for app, pv in rows(mysql_kwargs, f"SELECT app_id, pv FROM {sink.table}")} == pv_per_app
        assert our_prepared_branches(mysql_kwargs, op.pipeline_id) == []
    else:
        written = [r[0] for r in rows(mysql_kwargs, f"SELECT event_id FROM {sink.table}")]
        assert len(written) == len(event_ids) == 800 and set(written) == event_ids

    # The batch log and the committed offsets are PostgreSQL's rows; `airflow eo` reads them there.
    assert pg_rows(postgres_kwargs, "SELECT batch_id, state FROM eo_batch WHERE pipeline_id = %s ORDER BY batch_id",
                   (op.pipeline_id,)) == [(0, "committed"), (1, "committed")]
    offsets = dict(pg_rows(postgres_kwargs, "SELECT kafka_partition, next_offset FROM eo_offset "
                           "WHERE pipeline_id = %s", (op.pipeline_id,)))
    assert offsets == ends
    ops = pipeline_operations(pg_store, "kafka_default")
    status = ops.status(op.pipeline_id)
    assert sum(p.lag or 0 for p in status.partitions) == 0 and status.unfinished == [] and status.in_doubt == []
    assert [b.record.batch_id for b in ops.history(op.pipeline_id).batches] == [1, 0]
