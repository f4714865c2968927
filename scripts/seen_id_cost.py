"""What ``dedup_key``'s seen-id table costs as it grows with retention: bytes per id, and a batch's look-up, insert
and purge, on tables holding 0, 1,000,000 and 4,000,000 ids (MariaDB and PostgreSQL).

    make up && . .stack/env && .venv/bin/python scripts/seen_id_cost.py          # windows of 0, 1M, 4M ids
    .venv/bin/python scripts/seen_id_cost.py --short                              # 0, 10,000, 40,000 (the suite's)

A pipeline keeps one row per event id it saw within ``dedup_retention``, so the table holds about (events per second)
x (retention in seconds) ids. Each database gets a throwaway database (``eo_seen_cost_<random>``) on the stack's
server, dropped at the end; the table is made with the sink's own DDL (``seen_id_ddl``: the same columns and
indexes as ``eo_seen_ids``). It is filled to each window size with the server's own row generator (MariaDB's
``seq_0_to_N``, PostgreSQL's ``generate_series``), ids being the MD5 of a counter (16 random-looking bytes, as the
event ids' SHA-256 prefixes are) and ``seen_at`` rising, then analyzed. At each size:

- bytes per id: the table's data and indexes on disk (``information_schema.TABLES``; ``pg_total_relation_size``);
- look-up: the ids of one batch (``--batch``, a tenth of them held) read with the executors' ``SeenIdLookup``;
- insert: the batch's new ids (the other nine tenths), one ``INSERT .. SELECT`` from the generator;
- purge: the database's bounded purge (``purge_seen_ids``, ``PURGE_LIMIT`` ids) of the oldest ids.

The insert is the server's cost of taking ids into a table of that size, not our writer's (a Spark task's
``LOAD DATA`` / ``COPY`` of sorted ids: ``scripts/benchmark.py``'s ``eo_xa_events_dedup``). The server's buffer pool /
shared buffers are printed: the look-ups and inserts slow down once the table no longer fits in them. Numbers, not
assertions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from airflow_eo.core.dedup import PURGE_LIMIT, seen_pipeline_key  # noqa: E402
from airflow_eo.mysql.database import MySqlDatabase  # noqa: E402
from airflow_eo.postgres.database import PostgresDatabase  # noqa: E402
from airflow_eo.sqlsink.database import SqlDatabase  # noqa: E402
from airflow_eo.sqlsink.seen_ids import SeenIdLookup, create_seen_id_table, purge_seen_ids  # noqa: E402

TABLE = "eo_seen_ids"
PIPELINE = "seen_id_cost"
FIRST_MS = 1_767_225_600_000  # 2026-01-01: ids are dated one millisecond apart from here
KINDS = {"mariadb": "AIRFLOW_CONN_MYSQL_DEFAULT", "postgres": "AIRFLOW_CONN_POSTGRES_DEFAULT"}


def _connect_kwargs(kind: str) -> dict[str, Any]:
    if kind == "mariadb":
        from airflow_eo.hooks.mysql import EoMySqlHook

        return EoMySqlHook("mysql_default").get_connect_kwargs()
    from airflow_eo.hooks.postgres import EoPostgresHook

    return EoPostgresHook("postgres_default").get_connect_kwargs()


def _database_key(kind: str) -> str:
    return "database" if kind == "mariadb" else "dbname"


@contextmanager
def throwaway_database(kind: str, database: SqlDatabase) -> Iterator[dict[str, Any]]:
    """A fresh database on the stack's server: the connect arguments naming it; dropped at the end."""
    name = f"eo_seen_cost_{uuid.uuid4().hex[:10]}"
    admin_kwargs = _connect_kwargs(kind)
    admin = database.connect(admin_kwargs, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")  # a generated name: no quoting needed
        yield {**admin_kwargs, _database_key(kind): name}
    finally:
        with admin.cursor() as cur:
            if kind == "postgres":  # make sure nothing holds the database
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                            "AND pid <> pg_backend_pid()", (name,))
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


def _fill_statement(kind: str, first: int, count: int) -> tuple[str, tuple[Any, ...]]:
    """``INSERT .. SELECT`` of ids ``first`` .. ``first + count - 1`` from the server's generator."""
    if kind == "mariadb":
        return (f"INSERT INTO {TABLE} (pipeline_key, event_id, topic, kafka_partition, kafka_offset, seen_at, "
                f"batch_id) SELECT %s, UNHEX(MD5(seq)), 'page_views', seq %% 3, seq, %s + seq, 1 "
                f"FROM seq_{first}_to_{first + count - 1}", (seen_pipeline_key(PIPELINE), FIRST_MS))
    return (f"INSERT INTO {TABLE} (pipeline_key, event_id, topic, kafka_partition, kafka_offset, seen_at, batch_id) "
            f"SELECT %s, decode(md5(i::text), 'hex'), 'page_views', i %% 3, i, %s + i, 1 "
            f"FROM generate_series(%s::bigint, %s::bigint) AS i",
            (seen_pipeline_key(PIPELINE), FIRST_MS, first, first + count - 1))


def _ids(first: int, count: int) -> list[bytes]:
    import hashlib

    return [hashlib.md5(str(i).encode()).digest() for i in range(first, first + count)]


def _bytes_on_disk(kind: str, cur: Any) -> tuple[int, int]:
    """(data, indexes) in bytes, after the database's own statistics are brought up to date."""
    if kind == "mariadb":
        cur.execute(f"ANALYZE TABLE {TABLE}")
        cur.fetchall()
        cur.execute("SELECT data_length, index_length FROM information_schema.TABLES WHERE table_schema = DATABASE() "
                    "AND table_name = %s", (TABLE,))
        data, index = cur.fetchone()
        return int(data), int(index)
    cur.execute(f"VACUUM ANALYZE {TABLE}")
    cur.execute("SELECT pg_table_size(%s), pg_indexes_size(%s)", (TABLE, TABLE))
    data, index = cur.fetchone()
    return int(data), int(index)


def _server_memory(kind: str, cur: Any) -> str:
    if kind == "mariadb":
        cur.execute("SELECT @@innodb_buffer_pool_size")
        return f"innodb_buffer_pool_size {int(cur.fetchone()[0]) // 2**20} MiB"
    cur.execute("SHOW shared_buffers")
    return f"shared_buffers {cur.fetchone()[0]}"


def run_database(kind: str, windows: list[int], batch: int) -> dict[str, Any]:
    database: SqlDatabase = MySqlDatabase() if kind == "mariadb" else PostgresDatabase()
    with throwaway_database(kind, database) as kwargs:
        create_seen_id_table(database, kwargs, TABLE)
        lookup = SeenIdLookup(database, kwargs, TABLE, seen_pipeline_key(PIPELINE))
        conn = database.connect(kwargs, autocommit=True)
        held = purged = 0  # ids made (0 .. held - 1), and the oldest of them purged (0 .. purged - 1)
        points = []
        try:
            with conn.cursor() as cur:
                memory = _server_memory(kind, cur)
                for window in windows:
                    started = time.monotonic()
                    if window > held - purged:
                        cur.execute(*_fill_statement(kind, held, window - (held - purged)))
                        held = window + purged
                    fill_s = time.monotonic() - started
                    rows = held - purged
                    data, index = _bytes_on_disk(kind, cur) if rows else (0, 0)
                    # one batch: a tenth of its ids held (the newest ones), the rest new
                    present = min(rows, batch // 10)
                    asked = _ids(held - present, present) + _ids(held, batch - present)
                    started = time.monotonic()
                    found = lookup(asked)
                    lookup_s = time.monotonic() - started
                    if len(found) != present:
                        sys.exit(f"{kind}: the look-up found {len(found)} of the {present} ids held")
                    started = time.monotonic()
                    cur.execute(*_fill_statement(kind, held, batch - present))
                    insert_s = time.monotonic() - started
                    held += batch - present
                    started = time.monotonic()  # the oldest PURGE_LIMIT ids held before the batch are past retention
                    went = purge_seen_ids(database, kwargs, TABLE, seen_pipeline_key(PIPELINE),
                                          FIRST_MS + purged + min(PURGE_LIMIT, rows), PURGE_LIMIT)
                    purge_s = time.monotonic() - started
                    purged += went
                    points.append({"ids": rows, "fill_s": round(fill_s, 2),
                                   "data_bytes_per_id": round(data / rows, 1) if rows else None,
                                   "index_bytes_per_id": round(index / rows, 1) if rows else None,
                                   "lookup_s": round(lookup_s, 3), "insert_s": round(insert_s, 3),
                                   "purge_s": round(purge_s, 3), "purged": went})
        finally:
            conn.close()
    return {"database": kind, "server": memory, "batch": batch, "points": points}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", default="0,1000000,4000000",
                        help="ids held, comma-separated (default 0,1000000,4000000)")
    parser.add_argument("--batch", type=int, default=200_000, help="ids of one batch (default 200,000)")
    parser.add_argument("--short", action="store_true", help="windows 0,10000,40000 and batches of 2,000")
    parser.add_argument("--database", choices=[*KINDS, "both"], default="both")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results as JSON too")
    args = parser.parse_args(argv)
    windows = [0, 10_000, 40_000] if args.short else [int(w) for w in args.windows.split(",")]
    batch = 2_000 if args.short else args.batch
    if sorted(windows) != windows:
        parser.error("--windows must rise")
    results = [run_database(kind, windows, batch) for kind in (KINDS if args.database == "both" else [args.database])]
    for r in results:
        print(f"\n{r['database']} ({r['server']}): one batch of {r['batch']:,} ids, a tenth of them held")
        print(f"  {'ids held':>10}{'data B/id':>11}{'index B/id':>12}{'look-up s':>11}{'insert s':>10}{'purge s':>9}")
        for p in r["points"]:
            data = "-" if p["data_bytes_per_id"] is None else f"{p['data_bytes_per_id']:.0f}"
            index = "-" if p["index_bytes_per_id"] is None else f"{p['index_bytes_per_id']:.0f}"
            print(f"  {p['ids']:>10,}{data:>11}{index:>12}{p['lookup_s']:>11.3f}{p['insert_s']:>10.3f}"
                  f"{p['purge_s']:>9.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
