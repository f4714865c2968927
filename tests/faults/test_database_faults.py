"""MariaDB crashes mid-batch: ``mariadbd`` SIGKILLed at each step of a batch, then restarted.

For the XA sink (per-app counts added to ``app_pv``: a lost or doubled batch shows in the counts)
and the upsert sink (``page_view_events``), with store and sink on one server (the default stack)
and on two servers. Each step's attempt must fail with an error naming the lost database, without
hanging; the server is restarted on its data (InnoDB crash recovery keeps prepared XA branches);
then the same run again, more input and a later run must leave the sink equal to the ground truth
read from the topic, no prepared branch, and contiguous committed batches.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from airflow_eo.core.failpoints import fired
from airflow_eo.hooks.mysql import EoMySqlHook, OffsetStoreHook
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink
from examples import page_views
from tests.support.faults import Faults, check_end_state, gone, store_rows
from tests.support.kafka import create_topic
from tests.support.operator_harness import counts_table, events_table, operator, run

XA_STEPS = ["during_write", "in_store_commit", "after_prepare", "after_commit_point"]
UPSERT_STEPS = ["during_write", "in_store_commit", "after_commit_point"]
# What an attempt says when its database is gone (pymysql's errors, through Spark's for executors).
DATABASE_LOST = re.compile(r"Lost connection to (MySQL|server)|Can't connect to (MySQL|server)|gone away|"
                           r"Connection refused|\(2013|\(2003|\(2006")
ATTEMPT_SECONDS = 90  # far below any hang: connect_timeout is 10 s and the kernel closes a dead server's sockets


@pytest.mark.parametrize("layout", ["one_server", "two_servers"])
@pytest.mark.parametrize("kind", ["xa", "upsert"])
def test_the_database_crashing_at_every_step(kind, layout, stack: ModuleType, faults: Faults, bootstrap,
                                             mysql_kwargs, topic_name, request, monkeypatch):
    if layout == "two_servers":
        second = request.getfixturevalue("second_mariadb")
        monkeypatch.setenv("AIRFLOW_CONN_EO_OFFSET_STORE", f"mysql://{second['user']}:{second['password']}@"
                                                           f"127.0.0.1:{second['port']}/{second['database']}")
    store_kwargs = EoMySqlHook("eo_offset_store").get_connect_kwargs()
    OffsetStoreHook().get_store().migrate()  # a fresh second server has no store tables before the first take
    sink_pid_file: Path = stack.PID_FILES["mariadb"]
    store_pid_file: Path = stack.SECOND_MARIADB / "mariadb.pid" if layout == "two_servers" else sink_pid_file

    create_topic(bootstrap, topic_name, 3)
    page_views.produce_page_views(bootstrap, 2000, topic=topic_name)
    if kind == "xa":
        table = counts_table(mysql_kwargs)
        sink = MySqlXaSink(table=table, key_columns=["app_id"], updates={"pv": "add"})
        op = operator(topic_name, sink, transform=page_views.count_per_app)
        steps = XA_STEPS
    else:
        table = events_table(mysql_kwargs)
        op = operator(topic_name, MySqlUpsertSink(table=table, key_columns=["event_id"]))
        steps = UPSERT_STEPS
    run_id = f"manual__{uuid.uuid4().hex}"

    for step in steps:
        if store_rows(store_kwargs, "SELECT state FROM eo_batch WHERE pipeline_id = %s AND run_id = %s",
                      (op.pipeline_id, run_id)) == [("committed",)]:
            # With the sink on its own server, a crash after XA PREPARE does not stop the store's commit.
            run_id = f"manual__{uuid.uuid4().hex}"
        pid_file = store_pid_file if step == "in_store_commit" else sink_pid_file
        server = int(pid_file.read_text())
        started = time.monotonic()
        error: BaseException | None = None
        with faults.kill_at(step, pid_file) as fault_dir:
            try:
                run(op, run_id)
            except Exception as exc:  # the attempt's error is what is checked
                error = exc
        seconds = time.monotonic() - started
        # Where and when the kill fired, and when the attempt ended: in every message below.
        trace = f"\nfailpoint trace: {fired(str(fault_dir))}; attempt ended {time.time():.3f}"
        assert gone(server), f"{step}: the fault did not kill the database; {error!r}"[:3000] + trace
        assert seconds < ATTEMPT_SECONDS, f"{step}: the attempt took {seconds:.0f}s with its database gone" + trace
        if kind == "upsert" and step == "after_commit_point":
            assert error is None, f"the upsert sink has nothing to finalize after its commit point: {error!r}" + trace
        else:
            assert error is not None, f"{step}: the attempt went on as if its database were there" + trace
            assert DATABASE_LOST.search(str(error)), f"{step}: unclear error: {str(error)[-2000:]}" + trace
            where = {"during_write": "before", "after_prepare": "at" if layout == "one_server" else "after",
                     "in_store_commit": "at", "after_commit_point": "after"}[step]
            assert any(f"failed {where} its commit point" in note for note in getattr(error, "__notes__", [])), (
                f"{step}: the error does not say where the batch stands: {getattr(error, '__notes__', None)}" + trace)
        if pid_file == sink_pid_file:
            stack.start("mariadb")
        else:
            stack.second_mariadb_up()
        page_views.produce_page_views(bootstrap, 300, topic=topic_name)

    run(op, run_id)  # the same run again (Airflow's retry): recovers, or returns the committed batch
    page_views.produce_page_views(bootstrap, 500, topic=topic_name)
    run(op)  # a later run reads everything after that batch
    check_end_state(kind, table, op.pipeline_id, bootstrap, topic_name, mysql_kwargs, store_kwargs)
