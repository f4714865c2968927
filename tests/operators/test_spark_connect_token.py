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
