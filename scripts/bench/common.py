"""What every job of ``scripts/benchmark.py`` uses: its result (:class:`Job`), the run's settings, the
databases' fresh tables and checks, the Spark session and engine, the driver's peak memory."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_eo.core.config import BadRecordPolicy, ParseConfig, ValueFormat
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import EoMySqlHook
from airflow_eo.hooks.postgres import EoPostgresHook
from airflow_eo.hooks.spark import SparkSessionHook
from airflow_eo.sinks import MySqlUpsertSink
from airflow_eo.spark.engine import SparkBatchEngine
from examples import page_views

#: MariaDB Connector/J for Spark's JDBC writer, from Maven Central like the Kafka connector.
CONNECTOR_J = ("org.mariadb.jdbc", "mariadb-java-client", "3.5.3")
#: PostgreSQL's JDBC driver (pgjdbc), resolved the same way (its jars are pinned in ``JAR_SHA256``).
PGJDBC = ("org.postgresql", "postgresql", "42.7.8")
PG_CONN_ID = "postgres_default"
EVENT_COLUMNS = ("event_id", "app_id", "user_id", "ts")
ROWS_PER_STATEMENT = MySqlUpsertSink(table="t", key_columns=["k"]).rows_per_statement


@dataclass
class Job:
    """One measured job of one point of the sweep."""

    name: str
    events: int
    parallelism: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)
    note: str = ""
    records_per_s: float = 0.0
    ratio_to_best_peer: float | None = None
    #: the best peer of this job, which ``ratio_to_best_peer`` is to
    peer: str | None = None
    #: dead letters: records/s over the same sink's good-record rate (``eo_xa_events``)
    ratio_to_good_records: float | None = None
    fraction_of_limit: float | None = None
    fraction_of_shared_limit: float | None = None
    protocol_share: float | None = None
    #: where it ran: "local", or the Airflow connection of ``--spark-conn``
    spark: str = "local"
    #: peak resident memory of the driver's Python and JVM during this job (MiB)
    driver_peak_rss_mb: dict[str, int] | None = None

    def __post_init__(self) -> None:
        self.records_per_s = self.events / self.seconds if self.seconds > 0 else 0.0


# --------------------------------------------------------------------------- helpers


def mysql_kwargs() -> dict[str, Any]:
    return EoMySqlHook().get_connect_kwargs()


def sql(statement: str, args: Sequence[Any] = ()) -> list[tuple]:
    from airflow_eo.mysql.connection import connect as mysql_connect

    conn = mysql_connect(mysql_kwargs(), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return list(cur.fetchall())
    finally:
        conn.close()


#: Tables the running job made: dropped when it ends, so that every job meets a server without the others' rows.
made_tables: list[str] = []
made_seen_ids: list[str] = []  # pipeline ids whose seen ids (dedup_key) the run leaves behind


def fresh_table(example: str, label: str) -> str:
    table = page_views.create_table_like(mysql_kwargs(), example, f"bench_{label}_{uuid.uuid4().hex[:6]}")
    made_tables.append(table)
    return table


def drop_made_tables() -> None:
    from airflow_eo.core.dedup import seen_pipeline_key
    from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE

    while made_seen_ids:  # a dedup job's ids: the next run's look-ups and inserts would pay for them
        sql(f"DELETE FROM `{SEEN_ID_TABLE}` WHERE pipeline_key = %s", (seen_pipeline_key(made_seen_ids.pop()),))
    while made_tables:
        sql(f"DROP TABLE IF EXISTS `{made_tables.pop()}`")  # names made by fresh_table
    while made_pg_tables:
        pg_sql(f'DROP TABLE IF EXISTS "{made_pg_tables.pop()}"')  # names made by fresh_pg_table


def pg_kwargs() -> dict[str, Any]:
    return EoPostgresHook(PG_CONN_ID).get_connect_kwargs()


def pg_sql(statement: str, args: Sequence[Any] = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(**pg_kwargs(), autocommit=True) as conn:
        cur = conn.execute(statement, args)
        return cur.fetchall() if cur.description else []


made_pg_tables: list[str] = []


def fresh_pg_table(example: str, label: str) -> str:
    """A fresh PostgreSQL table shaped like the example table ``example`` (its key included)."""
    page_views.ensure_postgres_tables(pg_kwargs())
    table = f"bench_{label}_{uuid.uuid4().hex[:6]}"
    pg_sql(f'CREATE TABLE "{table}" (LIKE {example} INCLUDING ALL)')  # example: a name of POSTGRES_TABLES_DDL
    made_pg_tables.append(table)
    return table


def pg_table_rows(table: str) -> int:
    return int(pg_sql(f'SELECT COUNT(*) FROM "{table}"')[0][0])  # table names made by fresh_pg_table


def table_rows(table: str) -> int:
    return int(sql(f"SELECT COUNT(*) FROM `{table}`")[0][0])  # table names made by fresh_table


def expect(what: str, got: Any, wanted: Any) -> None:
    if got != wanted:
        raise AssertionError(f"{what}: got {got}, wanted {wanted}: this job's output is wrong, its time means nothing")


def whole_topic(topic: str) -> tuple[OffsetRange, ...]:
    parts = KafkaClusterHook("kafka_default").get_offset_source().partition_offsets([topic], "earliest")
    return tuple(OffsetRange(p.topic, p.partition, p.log_start, p.last_stable) for p in parts)


@dataclass
class Settings:
    """The command line's settings of the run, for every job of this process."""

    #: the Airflow connection of the Spark the jobs run on (``--spark-conn``); None: local (``AIRFLOW_EO_SPARK_MASTER``
    #: or ``local[*]``)
    spark_conn_id: str | None = None
    #: ``--cdc-phases``: after each of our change-data-capture jobs, its phases measured apart (scripts/bench/cdc.py)
    cdc_phases: bool = False


SETTINGS = Settings()
#: scripts/benchmark.py, which a point's child processes run again (``--point``, ``--r-db``, ``--delta``, ...)
SCRIPT = Path(__file__).resolve().parents[1] / "benchmark.py"


def spark_hook(conf: dict[str, str] | None = None) -> SparkSessionHook:
    return SparkSessionHook(SETTINGS.spark_conn_id, conf=conf)


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")




def engine(parallelism: int, transform: Any = None, schema: str | None = page_views.SCHEMA,
           on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL, parse: ParseConfig | None = None
           ) -> SparkBatchEngine:
    """``parse``: how records are parsed, instead of JSON values of ``schema`` (or strings without one)."""
    parse = parse or (
        ParseConfig(schema=schema, write_partitions=parallelism, on_bad_record=on_bad_record) if schema else
        ParseConfig(value_format=ValueFormat.STRING, write_partitions=parallelism, on_bad_record=on_bad_record))
    return SparkBatchEngine(spark_hook().get_conn, KafkaClusterHook("kafka_default").get_config(), parse,
                            transform=transform)


def parsed_events(df: Any) -> Any:
    """What most teams write: one from_json with the schema, the event's columns (no bad-record handling)."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), page_views.SCHEMA.replace(" NOT NULL", ""))
    return df.select(event.alias("e")).select(*[F.col(f"e.{c}").alias(c) for c in EVENT_COLUMNS])



def kafka_stream(spark: Any, topic: str, starting: str) -> Any:
    """The Structured Streaming peers' source: ``readStream`` of the topic from ``starting`` (Spark's JSON of the
    whole ranges' start), read_committed."""
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", os.environ["EO_KAFKA_BOOTSTRAP"])
            .option("assign", json.dumps({topic: sorted(int(p) for p in json.loads(starting)[topic])}))
            .option("startingOffsets", starting)
            .option("kafka.isolation.level", "read_committed")
            .load())



class DriverMemory:
    """Peak resident memory of the driver (this Python and its JVM) per job: the kernel's high-water mark
    (``VmHWM``), reset before each job (``clear_refs`` 5), so that one job's peak is not another's."""

    def __init__(self, jvm_pid: int) -> None:
        self.pids = {"python": os.getpid(), "jvm": jvm_pid}

    def reset(self) -> None:
        for pid in self.pids.values():
            Path(f"/proc/{pid}/clear_refs").write_text("5")

    def peak_mb(self) -> dict[str, int]:
        return {name: round(peak_rss_mb(pid)) for name, pid in self.pids.items()}
