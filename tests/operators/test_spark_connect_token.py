"""The Spark Connect token never reaches an error (nor, through it, a task log), in any spelling, and any token
reaches the server whole (no Spark Connect server needed: pyspark parses and refuses URLs before connecting)."""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote, quote_plus

from pyspark.sql.connect.client.core import DefaultChannelBuilder

from airflow_eo.hooks.spark import SparkSessionHook

TOKEN = "s3cr3t+Tok/en=="  # base64's "+", "/" and "="
SPELLINGS = {TOKEN, quote(TOKEN), quote(TOKEN, safe=""), quote_plus(TOKEN)}


def test_any_token_of_a_spark_connect_connection_reaches_pyspark_whole(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_EO_SPARK_CONNECT_TOKEN", json.dumps({
        "conn_type": "spark_connect", "host": "sc://spark.example", "port": 15002, "login": "eo user",
        "password": TOKEN, "extra": {"use_ssl": True}}))
    url = SparkSessionHook("eo_spark_connect_token").get_session_args()["remote"]
    channel = DefaultChannelBuilder(url)  # what pyspark makes of it (it refused the provider's URL)
    assert (channel.endpoint, channel.token, channel.userId, channel.use_ssl) == (
        "spark.example:15002", TOKEN, "eo user", True)


def test_a_spark_connect_url_pyspark_refuses_shows_neither_the_token_nor_its_encoded_forms():
    # In a child process: a Spark Connect builder leaves pyspark's process-wide state in remote mode.
    refused_url = f"sc://127.0.0.1:1/;token={quote(TOKEN)}"  # the Spark provider's URL: pyspark refuses, echoing it
    code = ("import sys, traceback\n"
            "from airflow_eo.core.errors import ConfigurationError\n"
            "from airflow_eo.spark.session import get_session\n"
            "try:\n"
            "    get_session(remote=sys.argv[1])\n"
            "except ConfigurationError as exc:\n"
            "    assert exc.__cause__ is None and exc.__suppress_context__\n"
            "    print(''.join(traceback.format_exception(exc)))\n")  # what a task log would show: the whole chain
    done = subprocess.run([sys.executable, "-c", code, refused_url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = done.stdout
    assert "cannot open a Spark Connect session at sc://127.0.0.1:1/" in shown
    assert not [s for s in SPELLINGS if s in shown] and "s3cr3t" not in shown
    assert "INVALID_CONNECT_URL" in shown  # pyspark's reason is still there


def refusal_in_a_child(url: str, conf: dict[str, str], env: dict[str, str]) -> str:
    """What a task log would show of ``get_session(remote=url, conf=conf)`` in a process with ``env`` (a child: a
    Spark Connect builder leaves pyspark's process-wide builder in remote mode)."""
    import os

    code = ("import json, sys, traceback\n"
            "from airflow_eo.core.errors import ConfigurationError\n"
            "from airflow_eo.spark.session import get_session\n"
            "try:\n"
            "    get_session(remote=sys.argv[1], conf=json.loads(sys.argv[2]))\n"
            "except ConfigurationError as exc:\n"
            "    print(''.join(traceback.format_exception(exc)))\n"
            "except BaseException as exc:\n"
            "    print('NOT A ConfigurationError:', ''.join(traceback.format_exception(exc)))\n")
    done = subprocess.run([sys.executable, "-c", code, url, json.dumps(conf)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_spark_master_beside_a_spark_connect_url_is_refused_without_the_token():
    """pyspark refuses spark.master next to a remote URL with CANNOT_CONFIGURE_SPARK_CONNECT_MASTER, quoting the
    URL (token percent-encoded); ours says what to remove and shows no spelling of the token."""
    url = f"sc://127.0.0.1:1/;user_id=u;token={quote(TOKEN, safe='')}"
    shown = refusal_in_a_child(url, {"spark.master": "local[2]"}, {})
    assert "NOT A ConfigurationError" not in shown, shown
    assert "remove spark.master" in shown
    assert not [s for s in SPELLINGS if s in shown] and "s3cr3t" not in shown


def test_a_master_variable_in_the_workers_environment_is_refused_without_the_token():
    url = f"sc://127.0.0.1:1/;user_id=u;token={quote(TOKEN, safe='')}"
    shown = refusal_in_a_child(url, {}, {"MASTER": "local[2]"})
    assert "NOT A ConfigurationError" not in shown, shown
    assert "unset MASTER" in shown
    assert not [s for s in SPELLINGS if s in shown] and "s3cr3t" not in shown


def test_every_spelling_of_the_token_is_masked_in_logs_once_the_connection_is_read(monkeypatch):
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    token = "An0ther+Tok/en=="
    monkeypatch.setenv("AIRFLOW_CONN_EO_SPARK_CONNECT_MASKED", json.dumps({
        "conn_type": "spark_connect", "host": "sc://spark.example", "port": 15002, "password": token}))
    SparkSessionHook("eo_spark_connect_masked").get_session_args()
    for spelling in {token, quote(token), quote(token, safe=""), quote_plus(token)}:
        logged = redact(f"[sc://spark.example:15002/;token={spelling}]")
        assert "Tok" not in logged and "An0ther" not in logged, (spelling, logged)
