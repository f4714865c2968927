"""The change-data-capture example's source side (DAG ``customers_cdc``): creates ``public.customers`` on the stack's
PostgreSQL, registers Debezium's connector ``cdc`` for it on the Kafka Connect worker (``make connect``) through
Connect's REST API, and changes the table: inserts, updates, deletes and primary-key changes, each its own
transaction or a few in one. ``--compare`` prints the source and the MySQL target side by side; ``--compare --delta
PATH`` the source and the Delta table at PATH (DAG ``customers_cdc_delta``), read with delta-rs.

Usage (after ``make up``, ``make connect`` and ``. .stack/env``)::

    python scripts/cdc_workload.py --changes 500          # register (once), then 500 changes
    python scripts/cdc_workload.py --compare              # after a run of the DAG: are the two tables equal?
    python scripts/cdc_workload.py --compare --delta /tmp/airflow_eo/lakehouse/delta/customers
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_eo.examples import customers


def connect_url() -> str:
    return f"http://127.0.0.1:{os.environ.get('EO_STACK_CONNECT_PORT', '28083')}"


def register(postgres: dict) -> None:
    """``POST /connectors`` unless the worker has it already."""
    try:
        with urllib.request.urlopen(f"{connect_url()}/connectors/{customers.CONNECTOR}", timeout=30):
            print(f"connector {customers.CONNECTOR} is registered")
            return
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    body = json.dumps({"name": customers.CONNECTOR, "config": customers.connector_config(postgres)}).encode()
    request = urllib.request.Request(f"{connect_url()}/connectors", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        print(f"registered connector {customers.CONNECTOR}: HTTP {answer.status}")


def workload(postgres: dict, changes: int, seed: int) -> None:
    import psycopg

    rng = random.Random(seed)
    with psycopg.connect(**postgres, autocommit=True) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM customers").fetchall()]
        next_id = max(ids, default=0) + 1
        for _ in range(changes):
            roll = rng.random()
            with conn.transaction():
                if roll < 0.3 or not ids:
                    conn.execute("INSERT INTO customers VALUES (%s, %s, %s, %s)",
                                 (next_id, f"customer {next_id}", f"c{next_id}@example.com", rng.randint(0, 1000)))
                    ids.append(next_id)
                    next_id += 1
                elif roll < 0.85:
                    conn.execute("UPDATE customers SET balance = balance + %s WHERE id = %s",
                                 (rng.randint(-50, 50), rng.choice(ids)))
                elif roll < 0.95:
                    gone = ids.pop(rng.randrange(len(ids)))
                    conn.execute("DELETE FROM customers WHERE id = %s", (gone,))
                else:  # a primary-key change: Debezium's delete of the old key and create of the new
                    moved = ids.pop(rng.randrange(len(ids)))
                    conn.execute("UPDATE customers SET id = %s WHERE id = %s", (next_id, moved))
                    ids.append(next_id)
                    next_id += 1
    print(f"{changes} changes; the source has {len(ids)} rows")


def compare(postgres: dict, mysql: dict | None, delta: str | None) -> int:
    import psycopg

    with psycopg.connect(**postgres, autocommit=True) as conn:
        source = {tuple(r) for r in conn.execute("SELECT id, name, email, balance FROM customers").fetchall()}
    if delta:
        from deltalake import DeltaTable

        rows = DeltaTable(delta).to_pyarrow_table(columns=["id", "name", "email", "balance"]).to_pylist()
        target = {(r["id"], r["name"], r["email"], r["balance"]) for r in rows}
    else:
        import pymysql

        target_conn = pymysql.connect(**(mysql or {}), autocommit=True)
        try:
            with target_conn.cursor() as cur:
                cur.execute("SELECT id, name, email, balance FROM customers")
                target = {tuple(r) for r in cur.fetchall()}
        finally:
            target_conn.close()
    print(f"source {len(source)} rows, target {len(target)} rows; only in the source: {len(source - target)}, "
          f"only in the target: {len(target - source)}")
    return 0 if source == target else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200, help="changes to make (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--compare", action="store_true", help="only compare the source and the target")
    parser.add_argument("--delta", help="with --compare: the Delta table's path (DAG customers_cdc_delta)")
    args = parser.parse_args()
    from airflow_eo.hooks.mysql import EoMySqlHook
    from airflow_eo.hooks.postgres import EoPostgresHook

    postgres = EoPostgresHook("postgres_default").get_connect_kwargs()
    if args.compare:
        return compare(postgres, None if args.delta else EoMySqlHook("mysql_default").get_connect_kwargs(),
                       args.delta)
    import psycopg

    with psycopg.connect(**postgres, autocommit=True) as conn:
        conn.execute(customers.SOURCE_DDL)
    register(postgres)
    if args.changes:
        workload(postgres, args.changes, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
