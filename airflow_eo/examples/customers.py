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


def debezium_connector(connector_class: str, login: dict[str, Any], name: str,
                       schemas_enable: bool = False) -> dict[str, str]:
    """What every Debezium connector here is given: its class, one task, the source's address and login (the
    Connect worker keeps it in its config topic: give it a user of its own in production), ``name`` as its topic
    prefix, its topics made by the worker, and Connect's JSON converter (``schemas_enable``: its schema/payload
    wrapper; both shapes are read)."""
    return {
        "connector.class": connector_class,
        "tasks.max": "1",
        "database.hostname": str(login["host"]),
        "database.port": str(login["port"]),
        "database.user": str(login["user"]),
        "database.password": str(login["password"]),
        "topic.prefix": name,
        # A broker that creates no topic on first use: the worker creates the connector's, one partition, one replica.
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": str(schemas_enable).lower(),
        "value.converter.schemas.enable": str(schemas_enable).lower(),
    }


def postgres_connector(postgres: dict[str, Any], name: str, table: str, schema: str = "public",
                       schemas_enable: bool = False) -> dict[str, str]:
    """Debezium's PostgreSQL connector for ``schema.table`` (``pgoutput``, a publication of that table alone made by
    Debezium), named ``name`` (also its topic prefix, replication slot and publication)."""
    return {
        **debezium_connector("io.debezium.connector.postgresql.PostgresConnector", postgres, name, schemas_enable),
        "database.dbname": str(postgres["dbname"]),
        "table.include.list": f"{schema}.{table}",
        "plugin.name": "pgoutput",
        "slot.name": name,
        "publication.name": name,
        "publication.autocreate.mode": "filtered",
    }


def connector_config(postgres: dict[str, Any]) -> dict[str, str]:
    """The example's connector: ``public.customers`` as ``cdc``, without the converter's wrapper."""
    return postgres_connector(postgres, CONNECTOR, SOURCE_TABLE)


def ensure_target(connect_kwargs: dict[str, Any]) -> None:
    """The MySQL target table: the source's columns and nothing else."""
    import pymysql

    conn = pymysql.connect(**connect_kwargs, autocommit=True)
    try:
        conn.cursor().execute(TARGET_DDL)
    finally:
        conn.close()
