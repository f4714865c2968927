"""``scripts/store_size.py --short``: it fills both stores, prints each operation's times and ratio, and leaves
nothing behind (its throwaway databases dropped). Nothing here is about speed (the machine is shared)."""

from __future__ import annotations

import psycopg
import pymysql

from tests.support.short_scripts import run_short

OPERATIONS = ["pipelines", "status", "verify", "plan + commit", "DAG tab"]


def test_store_size_short_prints_every_ratio_and_drops_its_databases(tmp_path, mysql_kwargs, postgres_kwargs):
    out = tmp_path / "store_size.json"
    results, stdout = run_short("store_size.py", out)
    assert [r["store"] for r in results] == ["mariadb", "postgres"]
    for r in results:
        assert r["rows"] == 20_000 and r["filled_pipeline_batches"] == 200
        assert list(r["ratio"]) == OPERATIONS and all(v > 0 for v in r["ratio"].values())
        assert all(r["empty"][k] > 0 and r["filled"][k] > 0 for k in OPERATIONS)
        printed = next(line for line in stdout.splitlines() if line.strip().startswith("pipelines"))
        assert printed.rstrip().split()[3].endswith("x")  # empty ms, filled ms, ratio
    with pymysql.connect(**mysql_kwargs) as conn, conn.cursor() as cur:
        cur.execute("SHOW DATABASES LIKE %s", (results[0]["database"],))
        assert cur.fetchall() == ()
    with psycopg.connect(**postgres_kwargs) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (results[1]["database"],)).fetchall() == []
