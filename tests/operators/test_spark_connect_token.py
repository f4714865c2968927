"""The Spark Connect token never reaches an error (nor, through it, a task log), in any spelling, and any token
reaches the server whole (no Spark Connect server needed: pyspark parses and refuses URLs before connecting)."""

from __future__ import annotations

import json
import traceback
from urllib.parse import quote, quote_plus

import pytest
from pyspark.sql.connect.client.core import DefaultChannelBuilder

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.hooks.spark import SparkSessionHook
from airflow_eo.spark.session import get_session

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
    refused_url = f"sc://127.0.0.1:1/;token={quote(TOKEN)}"  # the Spark provider's URL: pyspark refuses, echoing it
    with pytest.raises(ConfigurationError, match="cannot open a Spark Connect session at sc://127.0.0.1:1/") as got:
        get_session(remote=refused_url)
    shown = "".join(traceback.format_exception(got.value))  # what a task log would show: the whole chain
    assert got.value.__cause__ is None and got.value.__suppress_context__
    assert not [s for s in SPELLINGS if s in shown] and "s3cr3t" not in shown
    assert "INVALID_CONNECT_URL" in shown  # pyspark's reason is still there
