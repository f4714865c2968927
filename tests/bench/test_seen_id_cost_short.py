"""``scripts/seen_id_cost.py --short``: it fills a seen-id table to each window on both databases, finds the held ids
of each batch, prints each size's bytes per id and times, purges the oldest ids, and leaves nothing behind (its
throwaway databases dropped). Nothing here is about speed (the machine is shared)."""

from __future__ import annotations

import psycopg
import pymysql

from airflow_eo.core.dedup import PURGE_LIMIT
from tests.support.short_scripts import run_short


def test_seen_id_cost_short_measures_every_window_and_drops_its_databases(tmp_path, mysql_kwargs, postgres_kwargs):
    out = tmp_path / "seen_id_cost.json"
    results, stdout = run_short("seen_id_cost.py", out)
    assert [r["database"] for r in results] == ["mariadb", "postgres"]
    for r in results:
        points = r["points"]
        assert r["batch"] == 2_000 and [p["ids"] for p in points] == [0, 10_000, 40_000]
        # an empty table has no bytes per id; a filled one has at least its 24 bytes of key per id, and an index
        assert points[0]["data_bytes_per_id"] is None
        assert all(p["data_bytes_per_id"] >= 24 and p["index_bytes_per_id"] > 0 for p in points[1:])
        assert all(p["lookup_s"] > 0 and p["insert_s"] > 0 and p["purge_s"] > 0 for p in points)
        # the oldest ids go, PURGE_LIMIT at a time, once there are that many
        assert [p["purged"] for p in points] == [0, PURGE_LIMIT, PURGE_LIMIT]
        printed = [line.split() for line in stdout.splitlines() if line.strip().startswith(("10,000", "40,000"))]
        assert len(printed) == 4 and all(len(row) == 6 for row in printed)
    with pymysql.connect(**mysql_kwargs) as conn, conn.cursor() as cur:
        cur.execute("SHOW DATABASES LIKE 'eo_seen_cost_%'")
        assert cur.fetchall() == ()
    with psycopg.connect(**postgres_kwargs) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname LIKE 'eo_seen_cost_%'").fetchall() == []
