"""The limits of one point: ``r_kafka`` (Spark reads and counts the ranges) and ``r_db`` / ``r_db_pg`` (the
fastest load of the same rows into the same table), and the warm-up of the executors' Python workers."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_eo.core.batch import BatchContext
from bench.common import (
    EVENT_COLUMNS,
    ROWS_PER_STATEMENT,
    SCRIPT,
    Job,
    drop_made_tables,
    engine,
    expect,
    fresh_pg_table,
    fresh_table,
    mysql_kwargs,
    pg_kwargs,
    pg_table_rows,
    spark_hook,
    table_rows,
    whole_topic,
)
from examples.topics import read_topic


def r_kafka(topic: str, events: int, parallelism: int) -> Job:
    eng = engine(parallelism)
    spark = spark_hook().get_conn()
    batch = BatchContext("bench_r_kafka", 0, "bench", 0, whole_topic(topic))
    started = time.monotonic()
    expect("records read", eng.read(spark, batch).count(), events)
    return Job("r_kafka", events, parallelism, time.monotonic() - started)



def warm_python_workers(spark: Any, parallelism: int) -> None:
    """Starts the executors' Python workers (importing pyarrow and the sinks' drivers) before any job is timed, as
    the JVM's start-up is not timed: otherwise the first of our jobs pays it and the peers (JVM only) never do."""
    def touch(batches: Any) -> Any:
        import psycopg  # noqa: F401
        import pymysql  # noqa: F401

        yield from batches

    spark.range(parallelism, numPartitions=parallelism).mapInArrow(touch, "id long").collect()


def _insert_rows(args: tuple[dict[str, Any], str, list[tuple]]) -> int:
    from airflow_eo.mysql.connection import connect as mysql_connect

    connect, table, rows = args
    conn = mysql_connect(connect, autocommit=False)
    try:
        with conn.cursor() as cur:
            full = f"INSERT INTO `{table}` ({', '.join(EVENT_COLUMNS)}) VALUES " + ", ".join(
                ["(%s, %s, %s, %s)"] * ROWS_PER_STATEMENT)
            for at in range(0, len(rows), ROWS_PER_STATEMENT):
                chunk = rows[at:at + ROWS_PER_STATEMENT]
                statement = full if len(chunk) == ROWS_PER_STATEMENT else (
                    f"INSERT INTO `{table}` ({', '.join(EVENT_COLUMNS)}) VALUES "
                    + ", ".join(["(%s, %s, %s, %s)"] * len(chunk)))
                cur.execute(statement, [v for row in chunk for v in row])
                conn.commit()
        return len(rows)
    finally:
        conn.close()


def _load_file(args: tuple[dict[str, Any], str, str]) -> int:
    # The project's connection: the server may read this one file, while it is loaded, and no other.
    from airflow_eo.mysql.connection import connect as mysql_connect
    from airflow_eo.mysql.connection import loading_local_file

    connect, table, path = args
    conn = mysql_connect(connect, autocommit=True, local_infile=True)
    try:
        with loading_local_file(conn, path), conn.cursor() as cur:
            return cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE `{table}` FIELDS TERMINATED BY '\\t' "
                               f"({', '.join(EVENT_COLUMNS)})", (path,))
    finally:
        conn.close()


def _copy_file(args: tuple[dict[str, Any], str, str]) -> int:
    import psycopg

    connect, table, path = args
    with psycopg.connect(**connect) as conn, conn.cursor() as cur:  # one transaction, committed on exit
        with cur.copy(f'COPY "{table}" ({", ".join(EVENT_COLUMNS)}) FROM STDIN') as copy, open(path, "rb") as data:
            while block := data.read(1 << 20):
                copy.write(block)
        return cur.rowcount


def r_db_elsewhere(topic: str, events: int, parallelism: int, workdir: Path, database: str = "mysql") -> Job:
    """:func:`r_db` in a process of its own: its rows in memory must not count as the driver's peak memory."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--r-db",
                           f"{database}:{topic}:{events}:{parallelism}:{workdir}"], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"r_db ({database}) failed (exit {done.returncode})")
    return Job(**json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RDB "))[4:]))


def r_db(topic: str, events: int, parallelism: int, workdir: Path, database: str = "mysql") -> Job:
    """The fastest load of the topic's rows into a fresh table from ``parallelism`` connections (processes, like
    Spark's writer tasks): on MariaDB multi-row INSERT or LOAD DATA, on PostgreSQL (``database="postgres"``,
    job ``r_db_pg``) COPY. Reading and parsing the topic, and writing the files, are not timed."""
    rows = []
    for _, value in read_topic(os.environ["EO_KAFKA_BOOTSTRAP"], topic)[0]:
        event = json.loads(value or b"{}")
        ts = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).replace(tzinfo=None)
        rows.append((event["event_id"], event["app_id"], event["user_id"], ts))
    expect("rows read", len(rows), events)
    slices = [rows[i::parallelism] for i in range(parallelism)]
    files = []
    for i, part in enumerate(slices):
        path = workdir / f"r_db_{i}.tsv"
        path.write_text("".join(f"{e}\t{a}\t{u}\t{t.isoformat(sep=' ')}\n" for e, a, u, t in part))
        files.append(str(path))
    postgres = database == "postgres"
    connect = pg_kwargs() if postgres else mysql_kwargs()
    methods: tuple[tuple[str, Callable[[Any], int], list[Any]], ...] = (
        (("copy_from_stdin", _copy_file, files),) if postgres else
        (("multi_row_insert", _insert_rows, slices), ("load_data_local_infile", _load_file, files)))
    timings = {}
    # Spawned, not forked: a fork would share (and then close) the driver's connection to its JVM.
    with ProcessPoolExecutor(parallelism, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(abs, range(parallelism)))  # the processes exist before the clock starts
        for method, work, inputs in methods:
            table = fresh_pg_table("page_view_events", "rdb") if postgres else fresh_table("page_view_events", "rdb")
            started = time.monotonic()
            done = sum(pool.map(work, [(connect, table, a) for a in inputs]))
            timings[method] = time.monotonic() - started
            loaded = pg_table_rows(table) if postgres else table_rows(table)
            expect(f"rows loaded by {method}", (done, loaded), (events, events))
            drop_made_tables()
    best = min(timings, key=lambda m: timings[m])
    return Job("r_db_pg" if postgres else "r_db", events, parallelism, timings[best],
               {k: round(v, 3) for k, v in timings.items()}, note=f"fastest: {best}")
