"""What the Exactly-once tab's app exposes without a login, and what an error shows to any DAG reader
(issue 23, item 7). The api-server, login and browser are in tests/ui; these need only the app and a store that
cannot be reached."""

from __future__ import annotations

import logging
import socket
import time

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from fastapi.testclient import TestClient

from airflow_eo.plugins.exactly_once import create_app, dag_pages, may_read_records, pages_as_shown


def test_no_api_docs_or_schema_are_served():
    client = TestClient(create_app())
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert client.get(path).status_code == 404, path


def test_an_unreachable_store_shows_its_kind_and_a_reference_not_hosts_or_users(monkeypatch, caplog):
    monkeypatch.setenv("AIRFLOW_CONN_EO_OFFSET_STORE", "mysql://secret_user:pw@db-host-7.internal:1/eo?connect_timeout=2")
    caplog.set_level(logging.ERROR)
    pages, error = dag_pages("some_dag", ["t"], 5)
    assert pages == [] and error is not None
    assert "OperationalError" in error and "reference" in error
    for private in ("db-host-7", "secret_user", "internal"):
        assert private not in error
    assert "db-host-7" in caplog.text  # the api-server's log keeps the details for whoever runs it


def test_a_store_that_never_answers_is_reported_within_the_tabs_timeout(monkeypatch):
    """A server that accepts the connection and never speaks (pymysql waits connect_timeout for its greeting)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        port = silent.getsockname()[1]
        monkeypatch.setenv("AIRFLOW_CONN_EO_OFFSET_STORE", f"mysql://eo:eo@127.0.0.1:{port}/eo?connect_timeout=20")
        monkeypatch.setenv("AIRFLOW__EO__UI_TIMEOUT_SECONDS", "1")
        started = time.monotonic()
        pages, error = dag_pages("some_dag", ["t"], 5)
        assert time.monotonic() - started < 5
        assert pages == [] and error is not None and "did not answer within 1 s" in error
    finally:
        silent.close()


class _AuthManager:
    """Answers like an auth manager whose role reads the DAG but not its task logs (Airflow's simple auth manager has
    no such role, so the real one cannot stand in here)."""

    def __init__(self, task_logs: bool) -> None:
        self.task_logs, self.asked = task_logs, []

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        self.asked.append((method, access_entity, details.id if details else None, user))
        return access_entity is not DagAccessEntity.TASK_LOGS or self.task_logs


def test_dead_letters_show_their_records_only_to_who_may_read_the_dags_task_logs():
    letter = {"batch_id": 1, "topic": "t", "partition": 0, "offset": 5, "key": "k-secret", "value": "card=4111",
              "headers": [{"key": "auth", "value": "token-secret"}], "error": "bad JSON", "created_at": None}

    class Page:  # what pages_as_shown reads of a PipelinePage
        def to_dict(self):
            return {"pipeline_id": "p", "dead_letters": [dict(letter)]}

    page = Page()
    reader = _AuthManager(task_logs=False)
    assert not may_read_records("orders_dag", "alice", reader)
    assert reader.asked == [("GET", DagAccessEntity.TASK_LOGS, "orders_dag", "alice")]
    hidden = pages_as_shown([page], may_read=False)[0]["dead_letters"][0]
    assert (hidden["key"], hidden["value"], hidden["headers"], hidden["hidden"]) == (None, None, None, True)
    assert (hidden["offset"], hidden["error"]) == (5, "bad JSON")  # where and why stay visible
    assert may_read_records("orders_dag", "bob", _AuthManager(task_logs=True))
    shown = pages_as_shown([page], may_read=True)[0]["dead_letters"][0]
    assert (shown["key"], shown["value"]) == ("k-secret", "card=4111") and "hidden" not in shown
    assert shown["headers"] == [{"key": "auth", "value": "token-secret"}]
