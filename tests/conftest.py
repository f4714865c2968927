"""Fixtures for tests against the real local stack (``make up``; ``make test`` does it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

# The helpers under tests/support assert as the tests do: their failures are explained as a test's are
# (registered before anything imports them).
pytest.register_assert_rewrite("tests.support")

from tests.support.lanes import group_of, use_this_workers_lane  # noqa: E402

# Before anything imports Airflow (which reads AIRFLOW_HOME once): a pytest-xdist worker's own stack.
use_this_workers_lane()

from airflow_eo.hooks.mysql import EoMySqlHook  # noqa: E402

# Fixtures of the stack's Kafka Connect worker and Debezium's connectors (connect_worker, debezium, binlog_mariadb,
# mariadb_debezium).
pytest_plugins = ["tests.support.connect"]

# The suite starts some 150 short-lived Spark JVMs (a driver per DAG run): on two cores, C2 compiler threads only
# compete with the work. C1 only makes each run ~8% faster (20.5-20.9 s -> 18.9-19.0 s for a 1,000-event
# page_views_xa run, measured here); results are unchanged. Tests only: a production driver keeps the JVM's
# defaults. Every JVM the tests start inherits it (run_dag children, the Spark cluster and Connect server,
# restarted brokers), so no collector is chosen here: Kafka's own -XX:+UseG1GC would then refuse to start.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the tests with `make test` (it starts the stack and sources .stack/env)")
    return value


@pytest.fixture(scope="session")
def bootstrap() -> str:
    return _env("EO_KAFKA_BOOTSTRAP")


@pytest.fixture(scope="session")
def mysql_kwargs() -> dict[str, Any]:
    _env("AIRFLOW_CONN_MYSQL_DEFAULT")
    return EoMySqlHook("mysql_default").get_connect_kwargs()


@pytest.fixture(scope="session")
def postgres_kwargs() -> dict[str, Any]:
    """psycopg arguments of the stack's PostgreSQL (``postgres_default``)."""
    from airflow_eo.hooks.postgres import EoPostgresHook

    _env("AIRFLOW_CONN_POSTGRES_DEFAULT")
    return EoPostgresHook("postgres_default").get_connect_kwargs()


@pytest.fixture
def mysql(mysql_kwargs) -> Iterator[pymysql.connections.Connection]:
    conn = pymysql.connect(**mysql_kwargs, autocommit=True)
    yield conn
    conn.close()


@pytest.fixture
def topic_name() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Airflow's metadata database (SQLite under AIRFLOW_HOME), migrated once."""
    _env("AIRFLOW_HOME")
    done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The lanes' scheduling (``make test``'s ``-n 2``): a test file runs whole on one worker, and the files of a
    shared group (:data:`tests.support.lanes.SHARED_GROUPS`) on one worker one after the other. (xdist's own
    ``--dist loadgroup`` renames each test's node id, which pytest 9.2 no longer lets it do: its groups were
    ignored.)"""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid.split("::")[0])

    return LaneScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``EO_TEST_TIMELINE=<file>``, one line per test: worker, start and end (epoch seconds), node id. The suite's
    wall time is set by how the files share the two lanes; this shows where a lane waited or ran alone."""
    timeline = os.environ.get("EO_TEST_TIMELINE")
    started = time.time()
    try:
        return (yield)
    finally:
        if timeline:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(timeline, "a") as out:
                out.write(f"{worker}\t{started:.1f}\t{time.time():.1f}\t{item.nodeid}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    """py4j says "Closing down clientserver connection" (INFO) from a finalizer at interpreter exit, after pytest has
    closed the stream its log handler writes to: "--- Logging error --- ValueError: I/O operation on closed file"
    would follow every run that used Spark. Nothing is lost by not saying it."""
    import logging

    logging.getLogger("py4j").setLevel(logging.WARNING)
