"""The change-data-capture example (DAG ``customers_cdc``): table ``public.customers`` of PostgreSQL, streamed by
Debezium's PostgreSQL connector (registered on a Kafka Connect worker as ``cdc``: topic ``cdc.public.customers``),
replicated into ``customers`` on MySQL / MariaDB. ``scripts/cdc_workload.py`` registers the connector and changes the
source table."""

from __future__ import annotations

from typing import Any

#: Debezium's topic prefix (``topic.prefix``), also the connector's name, its replication slot and publication.
CONNECTOR = "cdc"
SOURCE_TABLE = "customers"
TOPIC = f"{CONNECTOR}.public.{SOURCE_TABLE}"
#: The source table's columns as Spark DDL (``schema=`` of a ``changes="debezium"`` pipeline).
SCHEMA = "id INT, name STRING, email STRING, balance BIGINT"
SOURCE_DDL = ("CREATE TABLE IF NOT EXISTS customers (id INT PRIMARY KEY, name TEXT NOT NULL, email TEXT, "
              "balance BIGINT NOT NULL DEFAULT 0)")
TARGET_DDL = ("CREATE TABLE IF NOT EXISTS customers (id INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, "
              "email VARCHAR(255) NULL, balance BIGINT NOT NULL) ENGINE=InnoDB")


def connector_config(postgres: dict[str, Any]) -> dict[str, str]:
    """Debezium's PostgreSQL connector for the source table (``pgoutput``; Connect's JSON converter without the
    schema wrapper: both shapes are read), from the PostgreSQL connection's login (the Connect worker keeps it in its
    config topic: give it a user of its own in production)."""
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": str(postgres["host"]),
        "database.port": str(postgres["port"]),
        "database.user": str(postgres["user"]),
        "database.password": str(postgres["password"]),
        "database.dbname": str(postgres["dbname"]),
        "topic.prefix": CONNECTOR,
        "table.include.list": f"public.{SOURCE_TABLE}",
        "plugin.name": "pgoutput",
        "slot.name": CONNECTOR,
        "publication.name": CONNECTOR,
        "publication.autocreate.mode": "filtered",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
    }


def ensure_target(connect_kwargs: dict[str, Any]) -> None:
    """The MySQL target table: the source's columns and nothing else."""
    import pymysql

    conn = pymysql.connect(**connect_kwargs, autocommit=True)
    try:
        conn.cursor().execute(TARGET_DDL)
    finally:
        conn.close()
