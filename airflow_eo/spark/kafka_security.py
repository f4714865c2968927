"""The Spark Kafka source's ``kafka.*`` options from the ``kafka`` connection's librdkafka config.

The control plane (offset look-ups, the Kafka sink) talks librdkafka; Spark's reader is the Java client, which
names some settings differently and takes SASL credentials as one JAAS line. Credentials come only from the
connection (hidden from DAG readers, masked in logs), never from the DAG's ``kafka_options``: those are refused
when they carry a secret. Errors name settings, never their values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_eo.core.errors import ConfigurationError

# Same name, same meaning for both clients.
_SAME = ("bootstrap.servers", "ssl.key.password", "sasl.kerberos.service.name")
# librdkafka -> Java client, same values.
_RENAMED = {"sasl.mechanisms": "sasl.mechanism", "sasl.mechanism": "sasl.mechanism",
            "ssl.certificate.pem": "ssl.keystore.certificate.chain", "ssl.key.pem": "ssl.keystore.key"}
# Handled below (values translated), or no concern of a reader.
_TRANSLATED = ("security.protocol", "sasl.username", "sasl.password", "ssl.ca.location", "ssl.ca.pem",
               "ssl.endpoint.identification.algorithm")
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
#: Java client settings that hold a secret: refused in ``kafka_options`` (DAG code), masked in logs.
SECRET_OPTIONS = ("kafka.sasl.jaas.config", "kafka.ssl.key.password", "kafka.ssl.keystore.password",
                  "kafka.ssl.truststore.password", "kafka.ssl.keystore.key", "kafka.sasl.password")


def _jaas_quoted(value: str) -> str:
    # Kafka parses the JAAS line with a StreamTokenizer: backslash escapes inside double quotes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_kafka_options(kafka_config: Mapping[str, Any], kafka_options: Mapping[str, str]) -> dict[str, str]:
    """The reader's ``kafka.*`` options: the connection's security settings in the Java client's terms, then the
    DAG's ``kafka_options`` (which may not carry a secret).

    :param kafka_config: the ``kafka`` connection's librdkafka config.
    :param kafka_options: the operator's extra Spark Kafka source options (DAG code).
    :raises ConfigurationError: a secret in ``kafka_options``, or a security setting of the connection that the
        Java client cannot be given (named, without its value).
    """
    secret = sorted(k for k in kafka_options if k.lower() in SECRET_OPTIONS or "password" in k.lower())
    if secret:
        raise ConfigurationError(f"kafka_options {', '.join(secret)} hold a secret, which DAG code shows to every "
                                 "DAG reader: put credentials in the kafka connection's extra (sasl.username, "
                                 "sasl.password, ssl.key.password, ...), which the Spark reader is given")
    config = {k: v for k, v in kafka_config.items() if v is not None}
    unsupported = sorted(k for k in config if k.startswith(("sasl.", "ssl.", "enable.ssl"))
                         and k not in _SAME and k not in _RENAMED and k not in _TRANSLATED)
    if unsupported:
        raise ConfigurationError(f"the kafka connection's {', '.join(unsupported)} cannot be passed to Spark's Kafka "
                                 "reader (the Java client): supported are SASL PLAIN and SCRAM (sasl.username, "
                                 "sasl.password), ssl.ca.location, ssl.ca.pem, ssl.certificate.pem with ssl.key.pem, "
                                 "ssl.key.password, ssl.endpoint.identification.algorithm")
    options: dict[str, str] = {}
    for key in _SAME:
        if key in config:
            options[f"kafka.{key}"] = str(config[key])
    for key, java in _RENAMED.items():
        if key in config:
            options[f"kafka.{java}"] = str(config[key])
    if "security.protocol" in config:  # librdkafka is case-insensitive, the Java client wants upper case
        options["kafka.security.protocol"] = str(config["security.protocol"]).upper()
    if "ssl.endpoint.identification.algorithm" in config:
        algorithm = str(config["ssl.endpoint.identification.algorithm"])
        options["kafka.ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
    if "ssl.ca.location" in config:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = str(config["ssl.ca.location"])
    elif "ssl.ca.pem" in config:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.certificates"] = str(config["ssl.ca.pem"])
    if "kafka.ssl.keystore.key" in options:
        options["kafka.ssl.keystore.type"] = "PEM"
    if "sasl.username" in config or "sasl.password" in config:
        mechanism = options.get("kafka.sasl.mechanism", "GSSAPI").upper()
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ConfigurationError(f"the kafka connection's sasl.mechanism {mechanism} with sasl.username cannot be "
                                     "passed to Spark's Kafka reader: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
        options["kafka.sasl.mechanism"] = mechanism
        username, password = (_jaas_quoted(str(config.get(k, ""))) for k in ("sasl.username", "sasl.password"))
        options["kafka.sasl.jaas.config"] = f"{module} required username={username} password={password};"
    return {**options, **kafka_options}


def secret_values(options: Mapping[str, str]) -> list[str]:
    """The values of ``options`` that hold a secret (for the log masker)."""
    return [v for k, v in options.items() if v and (k.lower() in SECRET_OPTIONS or "password" in k.lower())]
