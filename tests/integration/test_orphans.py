"""Orphans made for real and resolved (issue 44): runs of an XA pipeline (MariaDB) and of a two-phase pipeline
(PostgreSQL) are SIGKILLed right after their branches were prepared (``after_prepare``), a Kafka-sink pipeline's run
after its last send (its transaction open), and none of them ever runs again. ``airflow eo verify --all`` finds
their branches (pipeline, batch, age, locks, "rollback") and the open transaction ("abort") and exits 1;
``airflow eo recover --orphans`` is a dry run, then with ``--apply --reason`` rolls the branches back under each
pipeline's fence, audited, and recovers the Kafka pipeline. Another writer's UPDATE of the same rows times out
before and succeeds after; read_committed readers of the Kafka topic wait before and not after.

The servers are shared with other tests, which may leave prepared branches of their own at any moment: the offset
store here is a database of this test's own, so every other branch is of a pipeline this store never knew ("unknown
pipeline") and must be left alone; assertions are scoped to this test's pipelines.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pymysql
import pytest

from airflow_eo.core.xid import pipeline_key
from airflow_eo.examples.page_views import APPS
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.mysql.xa import xa_session
from airflow_eo.postgres.prepared import prepared_session
from examples import ip_counts
from examples.page_views import produce_page_views
from tests.support.children import why
from tests.support.cli import eo
from tests.support.kafka import create_topic
from tests.support.operator_harness import rows
from tests.support.page_views import run_child
from tests.support.postgres import COUNTS_DDL, pg_rows


@pytest.fixture
def own_store(mysql_kwargs, monkeypatch) -> Iterator[str]:
    """An offset store in a MariaDB database of this test's own: it knows only this test's pipelines."""
    suffix = uuid.uuid4().hex[:8]
    database, conn_id = f"eo_orphans_{suffix}", f"eo_orphans_{suffix}"
    rows(mysql_kwargs, f"CREATE DATABASE {database}")
    k = mysql_kwargs
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       f"mysql://{k['user']}:{k['password']}@{k['host']}:{k['port']}/{database}")
    try:
        yield conn_id
    finally:
        rows(mysql_kwargs, f"DROP DATABASE IF EXISTS {database}")


def mysql_update_waits(mysql_kwargs: dict[str, Any], table: str) -> bool:
    """Whether another session's UPDATE of the rows waits on a lock (times out after 1 s) rather than succeeding."""
    conn = pymysql.connect(**mysql_kwargs, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")
            try:
                cur.execute(f"UPDATE {table} SET pv = pv WHERE app_id IN ({', '.join(['%s'] * len(APPS))})", APPS)
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1205, exc  # lock wait timeout exceeded
                return True
        conn.rollback()
        return False
    finally:
        conn.close()


def postgres_update_waits(postgres_kwargs: dict[str, Any], table: str) -> bool:
    with psycopg.connect(**postgres_kwargs) as conn:
        conn.execute("SET lock_timeout = '1s'")
        try:
            conn.execute(f"UPDATE {table} SET pv = pv WHERE app_id = ANY(%s)", (APPS,))
        except psycopg.errors.LockNotAvailable:
            return True
        conn.rollback()
        return False


@pytest.fixture
def leave_nothing(mysql_kwargs, postgres_kwargs) -> Iterator[dict[str, str]]:
    """The test's pipelines (kind -> id) and tables: whatever the test's outcome, no branch of them stays prepared
    on the shared servers, and the tables go."""
    made: dict[str, str] = {}
    yield made
    pipelines = [v for k, v in made.items() if k != "table"]
    with xa_session(mysql_kwargs) as xa:
        for xid in (x for p in pipelines for x in xa.recover(p)):
            xa.rollback(xid)
    with prepared_session(postgres_kwargs) as prepared:
        for xid in (x for p in pipelines for x in prepared.recover(p)):
            prepared.rollback(xid)
    if "table" in made:
        rows(mysql_kwargs, f"DROP TABLE IF EXISTS {made['table']}")
        pg_rows(postgres_kwargs, f"DROP TABLE IF EXISTS {made['table']}")


def ours(document: list[dict[str, Any]], pipelines: set[str]) -> dict[str, dict[str, Any]]:
    return {b["xid"]: b for b in document if b["pipeline_id"] in pipelines}


def test_orphans_of_killed_runs_are_found_by_verify_all_and_rolled_back_by_recover_orphans(
        own_store, leave_nothing, bootstrap, mysql_kwargs, postgres_kwargs, airflow_db):
    started = time.monotonic()
    suffix = uuid.uuid4().hex[:8]
    topic = create_topic(bootstrap, f"orphans_{suffix}", 3)
    mysql_table = pg_table = leave_nothing["table"] = f"orph_pv_{suffix}"
    rows(mysql_kwargs, COUNTS_DDL.format(name=mysql_table))
    pg_rows(postgres_kwargs, COUNTS_DDL.format(name=pg_table))
    for app in APPS:  # rows the batches update: their branches hold these rows' locks
        rows(mysql_kwargs, f"INSERT INTO {mysql_table} VALUES (%s, 0)", (app,))
        pg_rows(postgres_kwargs, f"INSERT INTO {pg_table} VALUES (%s, 0)", (app,))
    produce_page_views(bootstrap, 300, topic=topic)
    pipelines = {"MySqlXaSink": f"orphan_xa_{suffix}", "PostgresTwoPhaseSink": f"orphan_2pc_{suffix}"}
    tables = {"MySqlXaSink": mysql_table, "PostgresTwoPhaseSink": pg_table}
    leave_nothing.update(pipelines)
    for kind, pipeline in pipelines.items():
        job = {"topic": topic, "pipeline_id": pipeline, "run_id": f"manual__{uuid.uuid4().hex}",
               "offset_store_conn_id": own_store, "transform": "airflow_eo.examples.page_views.count_per_app",
               "sink": {"kind": kind, "table": tables[kind], "key_columns": ["app_id"], "updates": {"pv": "add"}}}
        crashed = run_child(["-m", "tests.support.operator_child", json.dumps(job)], fault="after_prepare")
        assert crashed.returncode == -signal.SIGKILL, f"{kind}: not killed after prepare: {why(crashed)}"
    # A Kafka-sink pipeline killed after its last send: its transaction stays open on the output topic.
    source, out = (create_topic(bootstrap, f"orphans_{name}_{suffix}", 1) for name in ("lines", "out"))
    ip_counts.produce_lines(bootstrap, 200, topic=source)
    kafka_pipeline = f"orphan_kafka_{suffix}"
    job = {"topic": source, "pipeline_id": kafka_pipeline, "run_id": f"manual__{uuid.uuid4().hex}",
           "offset_store_conn_id": own_store, "transform": "airflow_eo.examples.ip_counts.count_per_window_and_ip",
           "options": {"value_format": "string"}, "sink": {"kind": "KafkaTransactionalSink", "topic": out}}
    crashed = run_child(["-m", "tests.support.operator_child", json.dumps(job)], fault="after_last_send")
    assert crashed.returncode == -signal.SIGKILL, f"Kafka sink: not killed after its last send: {why(crashed)}"
    kafka = KafkaOffsetSource({"bootstrap.servers": bootstrap})
    out_partition = kafka.partitions([out])

    def readers_wait() -> bool:  # a read_committed reader stops at the open transaction's first offset
        return kafka.last_stable(out_partition) != kafka.high_watermarks(out_partition)

    assert readers_wait(), "the killed run's transaction should be open on the output topic"
    spark_done = time.monotonic()
    # The pipelines never run again. Their branches hold the rows.
    assert mysql_update_waits(mysql_kwargs, mysql_table), "the XA branches should hold the rows' locks"
    assert postgres_update_waits(postgres_kwargs, pg_table), "the prepared transactions should hold the rows' locks"

    store = ("--offset-store-conn-id", own_store)
    found = eo("verify", "--all", "--older-than", "0", *store, "-o", "json")
    assert found.returncode == 1, found.stdout[-3000:] + found.stderr[-3000:]  # in doubt, older than 0 s
    report = json.loads(found.stdout)
    mine = ours(report["in_doubt"], set(pipelines.values()))
    by_pipeline = {p: [b for b in mine.values() if b["pipeline_id"] == p] for p in pipelines.values()}
    assert all(by_pipeline.values()), f"each killed run left branches: {by_pipeline}"
    for kind, pipeline in pipelines.items():
        for b in by_pipeline[pipeline]:
            assert b["xid"].startswith(f"eo:{pipeline_key(pipeline)}:{b['batch_id']}/")
            assert b["batch_id"] == 0 and b["action"] == "rollback", b
            assert "never reached its commit point" in b["reason"], b
            assert b["age_seconds"] is not None and b["age_seconds"] >= 0, b
            assert b["database"].startswith("MySQL " if kind == "MySqlXaSink" else "PostgreSQL "), b
            if kind == "PostgresTwoPhaseSink":  # PostgreSQL says which relations it holds
                assert any(lock.startswith(pg_table) for lock in b["locks"]), b
            assert b["xid"] in report["overdue"]
    [open_one] = [b for b in report["in_doubt"] if b["pipeline_id"] == kafka_pipeline]
    assert (open_one["branch"], open_one["batch_id"], open_one["action"]) == ("open Kafka transaction", 0, "abort")
    assert open_one["xid"] == f"airflow_eo.{kafka_pipeline} {out}[0]" and open_one["xid"] in report["overdue"]
    assert open_one["locks"][0].startswith(f"read_committed readers of {out}[0] stop at offset 0")
    # Every branch of a pipeline this store never knew (other tests') is listed as such and left.
    assert all(b["pipeline"] == "unknown pipeline" and b["action"] == "leave"
               for b in report["in_doubt"] if b["xid"] not in mine and b["pipeline_id"] != kafka_pipeline)
    assert set(report["oldest_age_seconds"]) == set(report["databases"]) and len(report["databases"]) == 3
    table = eo("verify", "--all", "--older-than", "0", *store)
    assert table.returncode == 1 and pipelines["MySqlXaSink"] in table.stdout, table.stdout + table.stderr
    if os.environ.get("EO_SHOW_CLI"):  # the output docs/how-to/orphans.md quotes
        print(table.stdout, table.stderr)
        shown = eo("recover", "--orphans", "--older-than", "0", "--scan-interval", "1", *store)
        print(shown.stdout, shown.stderr)

    dry = eo("recover", "--orphans", "--older-than", "0", "--scan-interval", "1", *store, "-o", "json")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert {b["outcome"] for b in ours(json.loads(dry.stdout)["branches"], set(pipelines.values())).values()} == {
        "would rollback"}
    assert mysql_update_waits(mysql_kwargs, mysql_table), "a dry run changes nothing"

    applied = eo("recover", "--orphans", "--apply", "--reason", "pipelines retired, DAGs deleted",
                 "--older-than", "0", "--scan-interval", "1", *store, "-o", "json")
    if os.environ.get("EO_SHOW_CLI"):
        print(applied.stdout)
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    done = json.loads(applied.stdout)
    resolved = ours(done["branches"], set(pipelines.values()))
    assert set(resolved) == set(mine) and {b["outcome"] for b in resolved.values()} == {"rolled back"}, resolved
    assert [b["outcome"] for b in done["branches"] if b["pipeline_id"] == kafka_pipeline] == ["recovered (abort)"]
    assert not readers_wait(), "read_committed readers of the Kafka sink's topic should no longer wait"
    # Nothing else was touched: another pipeline's branch is unknown to this store and left (or skipped).
    assert all(b["outcome"] == "left" or b["outcome"].startswith("skipped")
               for b in done["branches"] if b["xid"] not in mine and b["pipeline_id"] != kafka_pipeline)

    assert not mysql_update_waits(mysql_kwargs, mysql_table), "the UPDATE should succeed once they are rolled back"
    assert not postgres_update_waits(postgres_kwargs, pg_table)
    with xa_session(mysql_kwargs) as xa, prepared_session(postgres_kwargs) as prepared:
        assert not [x for p in pipelines.values() for x in (*xa.recover(p), *prepared.recover(p))], "still prepared"
    assert rows(mysql_kwargs, f"SELECT SUM(pv) FROM {mysql_table}") == [(0,)]  # rolled back: nothing counted
    database = os.environ[f"AIRFLOW_CONN_{own_store.upper()}"].rsplit("/", 1)[1]
    audit = rows(mysql_kwargs, f"SELECT pipeline_id, action, reason, epoch, details FROM {database}.eo_audit")
    assert sorted((p, a, r) for p, a, r, _, _ in audit) == sorted(
        [(p, "recover orphans", "pipelines retired, DAGs deleted") for p in pipelines.values()]
        + [(kafka_pipeline, "recover", "pipelines retired, DAGs deleted")])
    assert all(json.loads(d)["completed"] is True and e is not None for *_, e, d in audit)
    print(f"three SIGKILLed runs {spark_done - started:.0f}s, the commands {time.monotonic() - spark_done:.0f}s")
