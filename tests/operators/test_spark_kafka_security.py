"""Spark's Kafka reader gets SASL/SSL settings from the ``kafka`` connection, in the Java client's terms; DAG code
cannot pass a secret; no error shows one, and the JAAS line is masked in task logs (issue 23, item 10).

There is no SASL broker on the stack: the mapping is checked here; the stack's PLAINTEXT reads run everywhere else.
"""

from __future__ import annotations

import logging

import pytest
from airflow.sdk._shared.secrets_masker.secrets_masker import _secrets_masker, redact

from airflow_eo.core.config import ParseConfig, ValueFormat
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.sinks import MySqlUpsertSink
from airflow_eo.spark.engine import SparkBatchEngine
from airflow_eo.spark.kafka_security import secret_values, spark_kafka_options

SECRET = 'S3cr"et\\Pw'  # a quote and a backslash: the JAAS line escapes them


def test_scram_over_tls_from_the_connection_in_the_java_clients_terms():
    config = {"bootstrap.servers": "b1:9093,b2:9093", "security.protocol": "sasl_ssl",
              "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "eo", "sasl.password": SECRET,
              "ssl.ca.location": "/etc/kafka/ca.pem", "ssl.endpoint.identification.algorithm": "none",
              "client.id": "control-plane"}
    assert spark_kafka_options(config, {"kafka.fetch.max.bytes": "1048576"}) == {
        "kafka.bootstrap.servers": "b1:9093,b2:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="eo" password="S3cr\\"et\\\\Pw";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
        "kafka.ssl.endpoint.identification.algorithm": "",
        "kafka.fetch.max.bytes": "1048576",
    }
    plain = spark_kafka_options({"bootstrap.servers": "b:9092", "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}, {})
    assert plain["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.plain.PlainLoginModule required '
                                               'username="u" password="p";')
    tls = spark_kafka_options({"bootstrap.servers": "b:9093", "security.protocol": "ssl", "ssl.ca.pem": "CA",
                               "ssl.certificate.pem": "CERT", "ssl.key.pem": "KEY", "ssl.key.password": SECRET}, {})
    assert tls == {"kafka.bootstrap.servers": "b:9093", "kafka.security.protocol": "SSL",
                   "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.certificates": "CA",
                   "kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.certificate.chain": "CERT",
                   "kafka.ssl.keystore.key": "KEY", "kafka.ssl.key.password": SECRET}
    assert sorted(secret_values(tls)) == sorted(["KEY", SECRET])


def test_no_secret_from_dag_code_and_no_error_or_log_line_shows_one(caplog):
    caplog.set_level(logging.DEBUG)
    refusals = []
    for options in ({"kafka.sasl.jaas.config": f'x required password="{SECRET}";'},
                    {"kafka.ssl.truststore.password": SECRET}):
        with pytest.raises(ConfigurationError, match="hold a secret") as refused:
            KafkaMicroBatchOperator(task_id="t", topics=["t"], sink=MySqlUpsertSink(table="x", key_columns=["k"]),
                                    value_format="string", kafka_options=options)
        refusals.append(str(refused.value))
    config = {"bootstrap.servers": "b:9092", "sasl.mechanism": "OAUTHBEARER", "sasl.username": "u",
              "sasl.password": SECRET}
    with pytest.raises(ConfigurationError, match="OAUTHBEARER") as refused:
        SparkBatchEngine(session_factory=lambda: None, kafka_config=config, parse=ParseConfig(ValueFormat.STRING))
    refusals.append(str(refused.value))
    with pytest.raises(ConfigurationError, match="sasl.oauthbearer.client.secret") as refused:
        spark_kafka_options({"sasl.oauthbearer.client.secret": SECRET, "sasl.password": SECRET}, {})
    refusals.append(str(refused.value))
    for text in [*refusals, caplog.text]:
        assert SECRET not in text and "S3cr" not in text
    # The operator masks the JAAS line's own text (the escaped password is not the connection's password).
    options = spark_kafka_options({"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": SECRET}, {})
    for value in secret_values(options):
        _secrets_masker().add_mask(value)
    line = f"reader option kafka.sasl.jaas.config={options['kafka.sasl.jaas.config']}"
    assert "S3cr" in line and "S3cr" not in str(redact(line))
