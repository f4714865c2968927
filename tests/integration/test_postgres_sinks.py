"""The PostgreSQL sinks under the real operator (real Kafka, Spark, PostgreSQL and MariaDB): checks before any side
effect, bad records and dead letters, interval mode, the store on PostgreSQL, a server killed. Their crash chains (a
SIGKILL at every protocol step) are those of every SQL sink kind: ``test_sink_crash_chains.py``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from datetime import datetime

import pyarrow as pa
import pytest

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.errors import BadRecordError, ConfigurationError, FencedError, UnsupportedServerError
from airflow_eo.core.recovery import BranchAction
from airflow_eo.core.xid import Xid
from airflow_eo.hooks.connected_sinks import build_sink
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.hooks.postgres import EoPostgresHook
from airflow_eo.sinks import PostgresTwoPhaseSink, PostgresUpsertSink
from examples.page_views import produce_page_views
from tests.support.bad_records import (
    BAD_HEADERS,
    BAD_VALUES,
    assert_headers_kept,
    run_with_driver_dead_letters,
)
from tests.support.kafka import create_topic
from tests.support.operator_harness import operator, rows, run
from tests.support.page_views import hour, hours_truth, produce_hours
from tests.support.postgres import (
    COUNTS_DDL,
    EVENTS_DDL,
    PG_STORE,
    pg_rows,
    pg_table,
    prepared_gids,
)
from tests.support.stack import load_stack, server_folder
from tests.support.stores import MYSQL_STORE


@pytest.fixture
def pg_store(monkeypatch, postgres_kwargs) -> str:
    """The connection id of an offset store on the stack's PostgreSQL (the sinks' database)."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{PG_STORE.upper()}", os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    return PG_STORE


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


def test_a_two_phase_task_attempt_rolls_back_its_earlier_attempts_prepared_transaction(postgres_kwargs):
    """A task's new attempt (a Spark retry) first rolls back the transaction its earlier attempt prepared, which holds
    the rows' locks (a prepared transaction has no lock timeout of its own), on its own connection in autocommit for
    a moment before its transaction begins; then writes and prepares its own."""
    pipeline, table = f"pgattempt_{uuid.uuid4().hex[:8]}", pg_table(postgres_kwargs, EVENTS_DDL, "pv_attempts")
    sink = build_sink(PostgresTwoPhaseSink(table=table, key_columns=["event_id"]), pipeline, MYSQL_STORE)
    sink.check()
    writer = sink.partition_writer(BatchContext(pipeline, 1, "r1", 1, ()), ["event_id", "app_id"])  # type: ignore[attr-defined]
    rows = [pa.RecordBatch.from_pylist([{"event_id": "e1", "app_id": "a"}])]
    try:  # whatever happens, no prepared transaction of the test stays (it would hold the next tests' snapshots)
        earlier, _ = writer(iter(rows), 0, 1, 1)
        later, written = writer(iter(rows), 0, 2, 2)
        assert written == 1 and earlier is not None and later is not None and later != earlier
        assert [x.encode() for x in sink.in_doubt(pipeline)] == [later]  # type: ignore[attr-defined]
        assert sink.end_branch(Xid.decode(later), BranchAction.COMMIT)  # type: ignore[attr-defined]
        assert pg_rows(postgres_kwargs, f"SELECT event_id, app_id FROM {table}") == [("e1", "a")]
    finally:
        for xid in sink.in_doubt(pipeline):  # type: ignore[attr-defined]
            sink.end_branch(xid, BranchAction.ROLLBACK)  # type: ignore[attr-defined]
