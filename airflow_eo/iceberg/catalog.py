"""An Iceberg catalog named by an Airflow connection (as plain data, no Airflow import): the properties Iceberg's Spark
catalog is given (``spark.sql.catalog.<catalog>.<property>``) and those pyiceberg's catalog is given, which reads the
same catalog on the driver (recovery, ``airflow eo status``) without Spark.

- a ``postgres`` connection: Iceberg's JDBC catalog in that database (Java: ``type=jdbc``, ``uri=jdbc:postgresql://``,
  ``jdbc.user`` / ``jdbc.password``; pyiceberg: its SQL catalog over SQLAlchemy and psycopg, which reads and writes the
  same ``iceberg_tables`` rows). The one kind tested here.
- an ``iceberg`` connection (apache-airflow-providers-apache-iceberg's: host = a REST catalog's URI, login / password
  = its OAuth2 client id / secret): a REST catalog (``credential = id:secret``).
- any other type: the catalog's properties in the connection's extra, ``type`` (``rest``, ``hive``, ``glue``, ...)
  or ``catalog-impl`` among them, given to both as they are.

The extra's keys (``warehouse``, ``io-impl``, ``s3.*``, ...) go to both sides under Iceberg's own names, which Java
and pyiceberg share. Secrets (the password, a credential) are only ever set on the running Spark session by the
adapter (never on a command line) and in pyiceberg's properties; no repr prints them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.core.errors import ConfigurationError


@dataclass(frozen=True)
class CatalogProperties:
    """One catalog as Iceberg's Spark catalog and pyiceberg are configured for it.

    :param spark: Java Iceberg's catalog properties (each set as ``spark.sql.catalog.<catalog>.<key>``).
    :param reader: pyiceberg's ``load_catalog`` properties.
    :param label: where the catalog is, without secrets (for messages).
    """

    spark: Mapping[str, str] = field(repr=False)
    reader: Mapping[str, str] = field(repr=False)
    label: str


def catalog_properties(info: ConnectionInfo, warehouse: str = "") -> CatalogProperties:
    """The catalog the connection ``info`` names (the module's docstring); ``warehouse`` (the sink's), when given,
    is where the catalog puts the tables it creates, over the extra's ``warehouse``."""
    extra = {str(k): str(v) for k, v in (info.extra or {}).items()}
    if warehouse:
        extra["warehouse"] = warehouse
    conn_type = (info.conn_type or "").lower()
    if conn_type in ("postgres", "postgresql"):
        if not info.schema:
            raise ConfigurationError(f"connection {info.conn_id!r}: an Iceberg JDBC catalog on PostgreSQL needs the "
                                     "database in the connection's schema")
        if not extra.get("warehouse"):
            raise ConfigurationError(f"connection {info.conn_id!r}: an Iceberg JDBC catalog needs a warehouse (where "
                                     "its tables' files go): the sink's warehouse= or the connection's extra")
        host, port = info.host or "localhost", int(info.port or 5432)
        label = f"jdbc:postgresql://{host}:{port}/{info.schema}"
        spark = {**extra, "type": "jdbc", "uri": label, "jdbc.user": info.login or "",
                 "jdbc.password": info.password or ""}
        login = quote(info.login or "", safe="") + (f":{quote(info.password, safe='')}" if info.password else "")
        reader = {**extra, "type": "sql",
                  "uri": f"postgresql+psycopg://{login}@{host}:{port}/{quote(info.schema, safe='')}"}
        return CatalogProperties(spark, reader, label)
    if conn_type == "iceberg":
        if not info.host:
            raise ConfigurationError(f"connection {info.conn_id!r}: an iceberg connection's host is the REST "
                                     "catalog's URI")
        properties = {**extra, "type": "rest", "uri": info.host}
        if info.login or info.password:
            properties["credential"] = f"{info.login or ''}:{info.password or ''}"
        return CatalogProperties(properties, dict(properties), info.host)
    if not extra.get("type") and not extra.get("catalog-impl"):
        raise ConfigurationError(
            f"connection {info.conn_id!r} ({conn_type or 'no type'}) does not name an Iceberg catalog: use a postgres "
            "connection (Iceberg's JDBC catalog in that database), an iceberg connection (a REST catalog), or put the "
            "catalog's properties in the extra, 'type' (rest, hive, glue, ...) among them")
    return CatalogProperties(extra, dict(extra), f"{extra.get('type') or extra['catalog-impl']} catalog "
                                                 f"{extra.get('uri', '')}".strip())


def reader_catalog(name: str, properties: CatalogProperties) -> Any:
    """pyiceberg's catalog ``name`` (the Spark catalog's name: a JDBC catalog's rows carry it)."""
    from pyiceberg.catalog import load_catalog

    return load_catalog(name, **properties.reader)
