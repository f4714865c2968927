"""The page-views example DAGs' topic, tables and transform: topic ``page_views`` → ``app_pv`` (XA) and
``page_view_events`` (upsert). Its producer and ground truth are in the repository's ``examples/page_views.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_eo.core.batch import BatchContext

TOPIC = "page_views"
PARTITIONS = 3
SCHEMA = "event_id STRING NOT NULL, app_id STRING NOT NULL, user_id STRING, ts TIMESTAMP"
APPS = [f"app_{i:02d}" for i in range(20)]

TABLES_DDL = {
    "app_pv": "CREATE TABLE IF NOT EXISTS app_pv (app_id VARCHAR(64) NOT NULL PRIMARY KEY, pv BIGINT NOT NULL) "
              "ENGINE=InnoDB",
    "page_view_events": "CREATE TABLE IF NOT EXISTS page_view_events (event_id VARCHAR(64) NOT NULL PRIMARY KEY, "
                        "app_id VARCHAR(64) NOT NULL, user_id VARCHAR(64) NULL, ts DATETIME(3) NULL) ENGINE=InnoDB",
}
TABLES_DDL["page_view_events_hourly"] = TABLES_DDL["page_view_events"].replace(
    "page_view_events", "page_view_events_hourly")
TABLES_DDL["app_pv_avro"] = TABLES_DDL["app_pv"].replace("app_pv", "app_pv_avro")
#: The event-driven example's table (DAG page_view_events_on_arrival).
ON_ARRIVAL = "page_view_events_on_arrival"
TABLES_DDL[ON_ARRIVAL] = TABLES_DDL["page_view_events"].replace("page_view_events", ON_ARRIVAL)

# The page views as Confluent-framed Avro (DAG page_views_avro_xa): two writer versions, schema ids 1 and 2; the
# second adds the timestamp with a default. The reader schema is the second.
AVRO_TOPIC = "page_views_avro"
_AVRO_V1 = {"type": "record", "name": "PageView", "namespace": "airflow_eo.examples", "fields": [
    {"name": "event_id", "type": "string"}, {"name": "app_id", "type": "string"},
    {"name": "user_id", "type": ["null", "string"], "default": None}]}
_AVRO_V2 = {**_AVRO_V1, "fields": [*_AVRO_V1["fields"], {
    "name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None}]}
AVRO_WRITER_SCHEMAS: dict[int, dict[str, Any]] = {1: _AVRO_V1, 2: _AVRO_V2}
AVRO_SCHEMA = _AVRO_V2


def count_per_app(df: DataFrame, batch: BatchContext) -> DataFrame:
    """Page views per app in this batch; the XA sink adds them to ``app_pv.pv``."""
    from pyspark.sql import functions as F

    return df.groupBy("app_id").agg(F.count("*").alias("pv"))


def ensure_tables(connect_kwargs: dict[str, Any]) -> None:
    import pymysql

    conn = pymysql.connect(**connect_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            for ddl in TABLES_DDL.values():
                cur.execute(ddl)
    finally:
        conn.close()


def create_table_like(connect_kwargs: dict[str, Any], example: str, name: str) -> str:
    """Create table ``name`` shaped like the example table ``example`` (``app_pv`` or ``page_view_events``)."""
    import pymysql

    conn = pymysql.connect(**connect_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(TABLES_DDL[example].replace(example, name))
    finally:
        conn.close()
    return name


#: The same tables on PostgreSQL (the ``page_views_pg`` DAG).
POSTGRES_TABLES_DDL = {
    "app_pv": "CREATE TABLE IF NOT EXISTS app_pv (app_id VARCHAR(64) NOT NULL PRIMARY KEY, pv BIGINT NOT NULL)",
    "page_view_events": "CREATE TABLE IF NOT EXISTS page_view_events (event_id VARCHAR(64) NOT NULL PRIMARY KEY, "
                        "app_id VARCHAR(64) NOT NULL, user_id VARCHAR(64) NULL, ts TIMESTAMP(3) NULL)",
}


def ensure_postgres_tables(connect_kwargs: dict[str, Any]) -> None:
    """The example tables on PostgreSQL (psycopg arguments of a ``postgres`` connection)."""
    import psycopg

    with psycopg.connect(**connect_kwargs, autocommit=True) as conn:
        for ddl in POSTGRES_TABLES_DDL.values():
            conn.execute(ddl)
