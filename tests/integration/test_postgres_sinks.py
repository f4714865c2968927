"""The PostgreSQL sinks under the real operator (real Kafka, Spark, PostgreSQL and MariaDB): each sink equals the
ground truth read from the topic after a SIGKILL at every protocol step it passes, with the offset store on the same
PostgreSQL database (the upsert sink: fenced) and on MySQL (the two-phase sink: mixed); no prepared transaction is
left and the committed batches tile the topic."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pyarrow as pa
import pytest

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.errors import BadRecordError, ConfigurationError, FencedError, UnsupportedServerError
from airflow_eo.core.xid import Xid
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.hooks.postgres import EoPostgresHook
from airflow_eo.hooks.sinks import build_sink
from airflow_eo.sinks import PostgresTwoPhaseSink, PostgresUpsertSink
from examples.page_views import ground_truth, produce_page_views
from tests.integration.operator_harness import operator, rows, run
from tests.integration.page_views import assert_contiguous, hour, hours_truth, produce_hours, run_child
from tests.support.bad_records import (
    BAD_HEADERS,
    BAD_VALUES,
    assert_headers_kept,
    run_with_driver_dead_letters,
)
from tests.support.children import why
from tests.support.kafka import create_topic
from tests.support.postgres import (
    COUNTS_DDL,
    EVENTS_DDL,
    MYSQL_STORE,
    PG_STORE,
    pg_rows,
    pg_table,
    prepared_gids,
    store_batches,
)
from tests.support.stack import load_stack, server_folder

# after_plan is before any sink code runs: the MySQL XA chain covers it.
TWO_PHASE_POINTS = ["during_write", "after_prepare", "in_store_commit", "after_commit_point",
                    "between_xa_commits"]
UPSERT_POINTS = ["during_write", "in_store_commit", "after_commit_point"]


@pytest.fixture
def pg_store(monkeypatch, postgres_kwargs) -> str:
    """The connection id of an offset store on the stack's PostgreSQL (the sinks' database)."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    return PG_STORE


def crash_chain(job: dict[str, Any], points: list[str], bootstrap: str, postgres_kwargs: dict[str, Any],
                mysql_kwargs: dict[str, Any], visible: Any) -> None:
    """One run SIGKILLed at each point in turn (as ``test_crash.crash_at_every_point``), then the same run again,
    more events and a later run."""
    store, pipeline = job["offset_store_conn_id"], job["pipeline_id"]
    OffsetStoreHook(store).get_store().migrate()  # its tables exist before the first batch is read back
    produce_page_views(bootstrap, 600, topic=job["topic"])
    run_id = f"manual__{uuid.uuid4().hex}"
    env = {f"AIRFLOW_CONN_{PG_STORE.upper()}": os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"]}
    for point in points:
        batches = store_batches(store, postgres_kwargs, mysql_kwargs, pipeline)
        if batches and batches[-1]["state"] == "committed":
            run_id = f"manual__{uuid.uuid4().hex}"  # that run committed: the next crash kills a new one
        crashed = run_child(["-m", "tests.integration.operator_child", json.dumps({**job, "run_id": run_id})],
                            fault=point, env=env)
        assert crashed.returncode == -signal.SIGKILL, (
            f"the run was not killed at {point}: rc={crashed.returncode}\n{why(crashed)}")
        assert store_batches(store, postgres_kwargs, mysql_kwargs, pipeline), "the batch row comes first"
        if point == "after_prepare":
            assert prepared_gids(postgres_kwargs, pipeline), "the crash should leave prepared transactions"
            assert not visible(), "nothing may be visible before the commit point"
        if point in ("after_prepare", "after_commit_point"):  # `airflow eo status` lists them, with the decision
            in_doubt = pipeline_operations(store, "kafka_default").status(pipeline).in_doubt
            gids = prepared_gids(postgres_kwargs, pipeline)
            assert sorted(b.decision.xid for b in in_doubt) == sorted(gids)
            assert bool(gids) is (job["sink"]["kind"] == "PostgresTwoPhaseSink")
            expected = "rollback" if point == "after_prepare" else "commit"
            assert {b.decision.action.value for b in in_doubt} <= {expected}
        produce_page_views(bootstrap, 100, topic=job["topic"])

    retried = run_child(["-m", "tests.integration.operator_child", json.dumps({**job, "run_id": run_id})], env=env)
    assert retried.returncode == 0, why(retried)  # the same run again
    produce_page_views(bootstrap, 200, topic=job["topic"])
    later = run_child(["-m", "tests.integration.operator_child", json.dumps({**job, "run_id": "later"})], env=env)
    assert later.returncode == 0, why(later)

    assert prepared_gids(postgres_kwargs, pipeline) == [], "prepared transactions were left behind"
    batches = store_batches(store, postgres_kwargs, mysql_kwargs, pipeline)
    assert_contiguous(batches)
    _, _, ends = ground_truth(bootstrap, job["topic"])
    committed: dict[int, int] = {}
    for batch in batches:
        if batch["state"] == "committed":
            committed.update({r["partition"]: r["until_offset"] for r in batch["ranges"]})
    assert committed == ends, "the committed batches do not reach the end of the topic"


def test_two_phase_sink_with_the_store_on_mysql_survives_sigkill_at_every_step(bootstrap, postgres_kwargs,
                                                                              mysql_kwargs, pg_store, airflow_db):
    topic = create_topic(bootstrap, f"pg2pc_{uuid.uuid4().hex[:8]}", 3)
    table = pg_table(postgres_kwargs, COUNTS_DDL, "app_pv")
    job = {"topic": topic, "pipeline_id": f"pg2pc_{topic}", "offset_store_conn_id": MYSQL_STORE,
           "transform": "airflow_eo.examples.page_views.count_per_app",
           "sink": {"kind": "PostgresTwoPhaseSink", "table": table, "key_columns": ["app_id"],
                    "updates": {"pv": "add"}}}
    crash_chain(job, TWO_PHASE_POINTS, bootstrap, postgres_kwargs, mysql_kwargs,
                visible=lambda: pg_rows(postgres_kwargs, f"SELECT * FROM {table}"))
    pv_per_app, _, _ = ground_truth(bootstrap, topic)
    assert dict(pg_rows(postgres_kwargs, f"SELECT app_id, pv FROM {table}")) == pv_per_app
    # airflow eo reads the pipeline through the sink's capabilities: nothing in doubt, nothing unfinished.
    status = pipeline_operations(MYSQL_STORE, "kafka_default").status(job["pipeline_id"])
    assert status.in_doubt == [] and status.unfinished == []


def test_upsert_sink_fenced_by_the_store_on_postgres_survives_sigkill_at_every_step(bootstrap, postgres_kwargs,
                                                                                   mysql_kwargs, pg_store,
                                                                                   airflow_db):
    topic = create_topic(bootstrap, f"pgup_{uuid.uuid4().hex[:8]}", 3)
    table = pg_table(postgres_kwargs, EVENTS_DDL, "pv_events")
    job = {"topic": topic, "pipeline_id": f"pgup_{topic}", "offset_store_conn_id": pg_store,
           "sink": {"kind": "PostgresUpsertSink", "table": table, "key_columns": ["event_id"]}}
    crash_chain(job, UPSERT_POINTS, bootstrap, postgres_kwargs, mysql_kwargs, visible=lambda: False)
    _, event_ids, _ = ground_truth(bootstrap, topic)
    written = [r[0] for r in pg_rows(postgres_kwargs, f"SELECT event_id FROM {table}")]
    assert len(written) == len(event_ids) and set(written) == event_ids
    # The sink's writes are fenced: the adapter built for this store checks the pipeline's epoch.
    sink = build_sink(PostgresUpsertSink(table=table, key_columns=["event_id"]), job["pipeline_id"], pg_store)
    assert sink.store_kwargs is not None  # type: ignore[attr-defined]


def test_checks_refuse_bad_targets_before_any_side_effect(postgres_kwargs, pg_store):
    """A missing table, a table without a unique key on the key columns: refused by check(), nothing created."""
    pipeline = f"pgcheck_{uuid.uuid4().hex[:8]}"
    no_key = pg_table(postgres_kwargs, "CREATE TABLE {name} (app_id VARCHAR(64) NOT NULL, pv BIGINT NOT NULL)",
                      "nokey")
    tables_before = pg_rows(postgres_kwargs, "SELECT count(*) FROM pg_class")[0][0]
    with pytest.raises(ConfigurationError, match="does not exist"):
        build_sink(PostgresTwoPhaseSink(table="no_such_table", key_columns=["app_id"]), pipeline, pg_store).check()
    with pytest.raises(ConfigurationError, match=r"PRIMARY KEY or UNIQUE constraint on exactly \(app_id\)"):
        build_sink(PostgresUpsertSink(table=no_key, key_columns=["app_id"]), pipeline, pg_store).check()
    assert pg_rows(postgres_kwargs, "SELECT count(*) FROM pg_class")[0][0] == tables_before


@pytest.fixture
def server_without_two_phase(monkeypatch) -> Iterator[str]:
    """A throwaway PostgreSQL server with max_prepared_transactions = 0 (PostgreSQL's default; under a second to
    start), as Airflow connection ``pg_zero``."""
    stack = load_stack()
    bin_dir, as_user = stack.postgres_bin_dir(), stack.postgres_user()
    home = server_folder("eo-pg-zero-", as_user)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctl = [str(bin_dir / "pg_ctl"), "-D", str(home / "data")]
    subprocess.run([str(bin_dir / "initdb"), "-D", str(home / "data"), "-U", "postgres", "--auth=trust", "--no-sync",
                    "-E", "UTF8", "--locale=C.UTF-8"], check=True, capture_output=True, cwd=home, **as_user)
    subprocess.run([*ctl, "-w", "-l", str(home / "log"), "-o", f"-p {port} -k {home} -c listen_addresses=127.0.0.1 "
                    "-c max_prepared_transactions=0 -c fsync=off", "start"], check=True, capture_output=True, cwd=home,
                   **as_user)
    monkeypatch.setenv("AIRFLOW_CONN_PG_ZERO", f"postgresql://postgres@127.0.0.1:{port}/postgres")
    try:
        yield "pg_zero"
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True, cwd=home, **as_user)
        shutil.rmtree(home, ignore_errors=True)


def test_the_two_phase_sink_refuses_a_server_without_prepared_transactions_before_any_side_effect(
        server_without_two_phase, bootstrap, mysql_kwargs, topic_name):
    conn_id = server_without_two_phase
    kwargs = EoPostgresHook(conn_id).get_connect_kwargs()
    pg_rows(kwargs, COUNTS_DDL.format(name="app_pv"))
    relations = pg_rows(kwargs, "SELECT count(*) FROM pg_class")
    create_topic(bootstrap, topic_name, 1)
    produce_page_views(bootstrap, 10, topic=topic_name)
    two_phase = operator(topic_name, PostgresTwoPhaseSink(table="app_pv", key_columns=["app_id"], conn_id=conn_id),
                         pipeline_id=f"pgzero_{topic_name}")
    with pytest.raises(UnsupportedServerError, match=r"max_prepared_transactions = 0.*set max_prepared_transactions"):
        run(two_phase)
    # Refused before the take: the store never heard of the pipeline, the server holds nothing new.
    assert rows(mysql_kwargs, "SELECT COUNT(*) FROM eo_pipeline WHERE pipeline_id = %s", (two_phase.pipeline_id,)) \
        == [(0,)]
    assert pg_rows(kwargs, "SELECT count(*) FROM pg_class") == relations
    # The upsert sink needs no prepared transaction: the same server takes it.
    build_sink(PostgresUpsertSink(table="app_pv", key_columns=["app_id"], conn_id=conn_id), "p", MYSQL_STORE).check()


@pytest.mark.parametrize("kind", ["upsert", "two_phase"])
def test_bad_records_commit_nothing_or_land_in_the_dead_letter_table_with_the_batch(kind, bootstrap, postgres_kwargs,
                                                                                     mysql_kwargs, topic_name):
    """Under on_bad_record="fail" a bad record commits nothing (the upsert sink's writers hold their staged rows
    until every task counted none: one pass; the two-phase sink's prepared transactions are rolled back); under
    "dead_letter" they land in the sink's PostgreSQL table with the batch. The table's name is mixed-case and
    schema-qualified: quoted as given."""
    create_topic(bootstrap, topic_name, 3)
    name = f"Events_{uuid.uuid4().hex[:8]}"
    pg_rows(postgres_kwargs, EVENTS_DDL.format(name=f'public."{name}"'))
    table, dead_table = f"public.{name}", f"Dead_{uuid.uuid4().hex[:8]}"
    spec = (PostgresUpsertSink if kind == "upsert" else PostgresTwoPhaseSink)(
        table=table, key_columns=["event_id"], dead_letter_table=dead_table)
    produce_page_views(bootstrap, 200, topic=topic_name, raw_values=BAD_VALUES[:1], raw_headers=BAD_HEADERS)
    # Two writer tasks fit the session's task slots: the upsert sink's writers vote in a barrier stage.
    failing = operator(topic_name, spec, pipeline_id=f"pgbad_{kind}_{topic_name}", write_partitions=2)
    with pytest.raises(BadRecordError, match=r"1 bad record\(s\).*malformed JSON.*Nothing was committed"):
        run(failing)
    assert pg_rows(postgres_kwargs, f'SELECT count(*) FROM public."{name}"') == [(0,)]
    assert prepared_gids(postgres_kwargs, failing.pipeline_id) == []
    # No dead letter either: their table is not even created.
    assert pg_rows(postgres_kwargs, "SELECT to_regclass(%s)", (f'"{dead_table}"',)) == [(None,)]

    good = produce_page_views(bootstrap, 300, topic=topic_name, raw_values=BAD_VALUES, raw_headers=BAD_HEADERS)
    op = operator(topic_name, spec, pipeline_id=f"pgdead_{kind}_{topic_name}", on_bad_record="dead_letter",
                  write_partitions=3)
    summary = run(op)
    assert (summary["records_in"], summary["rows_out"], summary["dead_letters"]) == (504, 500, 4)
    # Written by the tasks that found them, in the one Spark job of the batch: no pass through the driver (which
    # the engine times as "dead_letters"), each task's in a transaction of its own. The two-phase sink's are
    # prepared transactions of the batch (dead-letter partitions -2 - p, never the driver's -1), committed with
    # the good rows' at the commit point.
    assert "dead_letters" not in summary["seconds"], summary["seconds"]
    if kind == "two_phase":
        (xids,), = rows(mysql_kwargs, "SELECT xids FROM eo_batch WHERE pipeline_id = %s", (op.pipeline_id,))
        partitions = sorted(Xid.decode(x).partition for x in json.loads(xids))
        assert [p for p in partitions if p < 0] and -1 not in partitions and set(partitions) - {-2, -3, -4} \
            <= {0, 1, 2}, partitions
    written = dict(pg_rows(postgres_kwargs, f'SELECT event_id, ts FROM public."{name}"'))
    assert {e["event_id"] for e in good} <= set(written) and len(written) == 500
    assert all(written[e["event_id"]] == datetime.fromisoformat(e["ts"].replace("Z", "")) for e in good)  # UTC
    dead = build_sink(spec, op.pipeline_id, MYSQL_STORE).dead_letters(op.pipeline_id, None, 10)  # type: ignore[attr-defined]
    assert sorted(bytes(d["raw_value"]) for d in dead) == sorted([BAD_VALUES[0], *BAD_VALUES])
    assert {d["batch_id"] for d in dead} == {summary["batch_id"]}
    assert_headers_kept((d["raw_value"], d["kafka_headers"]) for d in dead)
    assert prepared_gids(postgres_kwargs, op.pipeline_id) == []


#: A PostgreSQL dead-letter table as releases before ``kafka_headers`` made it.
V1_DEAD_LETTER_DDL = (
    "CREATE TABLE {name} (pipeline_id VARCHAR(190) NOT NULL, topic VARCHAR(249) NOT NULL, kafka_partition INT NOT "
    "NULL, kafka_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, record_key BYTEA NULL, raw_value BYTEA NULL, "
    "error TEXT NOT NULL, created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP, "
    "PRIMARY KEY (pipeline_id, topic, kafka_partition, kafka_offset))")


def test_dead_letters_through_the_driver_keep_their_headers_in_a_table_an_older_release_made(
        bootstrap, postgres_kwargs, topic_name):
    """As on MySQL (``test_bad_input``): the driver's path carries the headers; an older release's table is read as
    it is, then gains ``kafka_headers`` before the batch writes (its old row NULL, the new ones their headers)."""
    create_topic(bootstrap, topic_name, 2)
    produce_page_views(bootstrap, 100, topic=topic_name, raw_values=BAD_VALUES, raw_headers=BAD_HEADERS)
    table, pipeline = pg_table(postgres_kwargs, EVENTS_DDL, "events"), f"pgdl_{topic_name}"
    dead_table = pg_table(postgres_kwargs, V1_DEAD_LETTER_DDL, "dead")
    pg_rows(postgres_kwargs, f"INSERT INTO {dead_table} (pipeline_id, topic, kafka_partition, kafka_offset, batch_id, "
            "raw_value, error) VALUES (%s, 'before', 0, 0, 0, 'old', 'bad')", (pipeline,))
    spec = PostgresUpsertSink(table=table, key_columns=["event_id"], dead_letter_table=dead_table)
    sink = build_sink(spec, pipeline, MYSQL_STORE)
    [old] = sink.dead_letters(pipeline, None, 10)  # type: ignore[attr-defined]
    assert old["raw_value"] == b"old" and "kafka_headers" not in old

    summary = run_with_driver_dead_letters(spec, pipeline, topic_name)
    assert (summary.records_in, summary.rows_out, summary.dead_letters) == (103, 100, 3)
    assert "dead_letters" in summary.seconds  # the engine's time of the pass through the driver
    dead = sink.dead_letters(pipeline, None, 10)  # type: ignore[attr-defined]
    assert [(d["topic"], d["kafka_headers"]) for d in dead if d["topic"] == "before"] == [("before", None)]
    assert_headers_kept((d["raw_value"], d["kafka_headers"]) for d in dead if d["topic"] != "before")
    # Read back in SQL, as README shows: one row per header, in order, values decoded from base64.
    headers = pg_rows(postgres_kwargs, f"SELECT h.n, h.e->>'key', decode(h.e->>'value', 'base64') FROM {dead_table}, "
                      "json_array_elements(kafka_headers::json) WITH ORDINALITY AS h(e, n) WHERE pipeline_id = %s "
                      "AND raw_value = %s ORDER BY h.n", (pipeline, BAD_VALUES[0]))
    assert [(k, v) for _, k, v in headers] == BAD_HEADERS[0]


def test_a_zombie_writer_of_the_upsert_sink_cannot_write_after_a_newer_attempt_took_the_pipeline(postgres_kwargs,
                                                                                                  pg_store):
    """The fence, executor side: a partition writer of an attempt whose epoch a newer take superseded (an executor
    that outlived its driver) aborts before its insert; the newer attempt's writer writes."""
    pipeline, table = f"pgzombie_{uuid.uuid4().hex[:8]}", pg_table(postgres_kwargs, EVENTS_DDL, "pv_zombie")
    store = OffsetStoreHook(pg_store).get_store()
    store.migrate()
    sink = build_sink(PostgresUpsertSink(table=table, key_columns=["event_id"]), pipeline, pg_store)
    sink.check()
    columns = ["event_id", "app_id"]
    rows_in = [pa.RecordBatch.from_pylist([{"event_id": "e1", "app_id": "zombie"}])]
    zombie = sink.partition_writer(BatchContext(pipeline, 0, "r1", store.take_pipeline(pipeline), ()), columns)  # type: ignore[attr-defined]
    newer = store.take_pipeline(pipeline)
    with pytest.raises(FencedError, match="newer attempt"):
        zombie(iter(rows_in), partition=0, stage_id=0, attempt_id=0)
    assert pg_rows(postgres_kwargs, f"SELECT count(*) FROM {table}") == [(0,)]
    writer = sink.partition_writer(BatchContext(pipeline, 0, "r2", newer, ()), columns)  # type: ignore[attr-defined]
    assert writer(iter([pa.RecordBatch.from_pylist([{"event_id": "e1", "app_id": "newer"}])]), 0, 0, 0) == (None, 1)
    assert pg_rows(postgres_kwargs, f"SELECT event_id, app_id FROM {table}") == [("e1", "newer")]


def test_the_upsert_sink_in_interval_mode_is_fenced_per_interval_and_replays_change_nothing(bootstrap,
                                                                                            postgres_kwargs, pg_store,
                                                                                            topic_name):
    """Interval mode with the store in the sink's database: each interval's writes are fenced by the interval's
    epoch (eo_interval); a replayed interval rewrites the same rows."""
    create_topic(bootstrap, topic_name, 3)
    events = produce_hours(bootstrap, topic_name, [40, 60, 30])  # hour 2 ends hour 1 on every partition
    table = pg_table(postgres_kwargs, EVENTS_DDL, "pv_hourly")
    op = operator(topic_name, PostgresUpsertSink(table=table, key_columns=["event_id"]), mode="interval",
                  offset_store_conn_id=pg_store)
    first = run(op, "backfill__h1", interval=hour(1))
    run(op, "backfill__h0", interval=hour(0))
    before = sorted(pg_rows(postgres_kwargs, f"SELECT event_id, app_id, ts FROM {table}"))
    assert {r[0] for r in before} == hours_truth(events, 0, 1)
    replay = run(op, "scheduled__h1_again", interval=hour(1))
    assert replay["replayed"] and replay["ranges"] == first["ranges"]
    assert sorted(pg_rows(postgres_kwargs, f"SELECT event_id, app_id, ts FROM {table}")) == before
    assert pg_rows(postgres_kwargs, "SELECT count(*) FROM eo_interval WHERE pipeline_id = %s", (op.pipeline_id,)) \
        == [(2,)]
