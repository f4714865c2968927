"""What a big batch log costs: ``airflow eo pipelines``, ``status``, ``verify``, a batch's planning + commit and what
the DAG tab reads, on an empty offset store and on one holding N batch-log rows across 100 pipelines (MariaDB and
PostgreSQL).

    make up && . .stack/env && .venv/bin/python scripts/store_size.py            # 1,000,000 rows
    .venv/bin/python scripts/store_size.py --short                                 # 20,000 rows (the suite's)

Each store is a throwaway database (``eo_store_size_<random>``) on the stack's MariaDB (``mysql_default``) and
PostgreSQL (``postgres_default``), dropped at the end, with a one-partition topic (deleted at the end). A probe
pipeline with a short history of real batches (``take_pipeline``, ``insert_batch``, ``commit_batch``) and 100 other
pipelines of one batch each are measured (the "empty" store: the same pipelines, no history); then those 100
pipelines get N/100 committed batches each (one
``INSERT .. SELECT`` from a generator per pipeline: ``seq_0_to_<n>`` on MariaDB, ``generate_series`` on PostgreSQL;
then ``ANALYZE``, and on PostgreSQL ``VACUUM``, as the databases' own maintenance leaves a store filled over
months), and the probe is measured again.
Each time is the median of ``--repeat`` calls of the operations in-process (``PipelineOperations``: the functions
``airflow eo`` runs). ``verify`` of one of the filled pipelines is printed too: ``verify`` reads a pipeline's whole
history, so its cost follows that pipeline's own batch count (``airflow eo prune`` bounds it), not the store's.
Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from airflow_eo.core.batch import BatchSummary, Owner  # noqa: E402
from airflow_eo.core.ranges import OffsetRange  # noqa: E402
from airflow_eo.hooks.operations import pipeline_operations  # noqa: E402
from airflow_eo.ops.service import PipelineOperations  # noqa: E402
from airflow_eo.sqlstore.store import SqlOffsetStore  # noqa: E402
from examples.topics import delete_topics  # noqa: E402

PIPELINES = 100
PROBE_BATCHES = 20
TARGET_RATIO = 1.5
PROBE_OWNER = Owner("store_size_dag", "probe_task")
UI_BATCH_LIMIT = 20  # the tab's default ([eo] ui_batch_limit)
KINDS = {"mariadb": "AIRFLOW_CONN_MYSQL_DEFAULT", "postgres": "AIRFLOW_CONN_POSTGRES_DEFAULT"}


def _admin_connect(kind: str, conn_id: str | None = None) -> Any:
    """An autocommit connection to the stack's server: its default database (to create and drop databases), or
    ``conn_id``'s (statements that run outside a transaction)."""
    if kind == "mariadb":
        import pymysql

        from airflow_eo.hooks.mysql import EoMySqlHook

        return pymysql.connect(**EoMySqlHook(conn_id or "mysql_default").get_connect_kwargs(), autocommit=True)
    import psycopg

    from airflow_eo.hooks.postgres import EoPostgresHook

    return psycopg.connect(**EoPostgresHook(conn_id or "postgres_default").get_connect_kwargs(), autocommit=True)


@contextmanager
def throwaway_store(kind: str) -> Iterator[tuple[str, str]]:
    """A fresh database on the stack's server and an Airflow connection id naming it; dropped at the end."""
    database = f"eo_store_size_{uuid.uuid4().hex[:10]}"
    admin = _admin_connect(kind)
    try:
        admin.cursor().execute(f"CREATE DATABASE {database}")  # a generated name: no quoting needed
        url = urlsplit(os.environ[KINDS[kind]])
        conn_id = f"eo_store_size_{kind}"
        os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = urlunsplit(url._replace(path=f"/{database}"))
        yield conn_id, database
    finally:
        if kind == "postgres":  # the store's connections are closed; make sure nothing holds the database
            admin.cursor().execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                   "AND pid <> pg_backend_pid()", (database,))
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {database}")
        admin.close()


@contextmanager
def topic() -> Iterator[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": os.environ["EO_KAFKA_BOOTSTRAP"]})
    name = f"store_size_{uuid.uuid4().hex[:10]}"
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result()
    try:
        yield name
    finally:
        delete_topics(os.environ["EO_KAFKA_BOOTSTRAP"], [name])


def plan_and_commit(store: SqlOffsetStore, pipeline_id: str, epoch: int, topic_name: str) -> None:
    """One batch of the pipeline as a run plans and commits it (the store's calls)."""
    start = store.committed_offsets(pipeline_id).get((topic_name, 0), 0)
    batch = store.insert_batch(pipeline_id, epoch, f"manual__{uuid.uuid4().hex}",
                               [OffsetRange(topic_name, 0, start, start + 10)], [])
    store.commit_batch(batch, epoch, BatchSummary.of(batch, batch.run_id, epoch))


def fill(store: SqlOffsetStore, kind: str, conn_id: str, first: int, last: int, topic_name: str) -> float:
    """Committed batches ``first`` .. ``last - 1`` of each of the :data:`PIPELINES` pipelines (``first`` 0: the
    pipelines are made too); returns the seconds it took."""
    started = time.monotonic()
    ranges = ("CONCAT('[{\"topic\": \"{t}\", \"partition\": 0, \"from_offset\": ', s * 10, "
              "', \"until_offset\": ', s * 10 + 10, '}]')").replace("{t}", topic_name)
    if kind == "mariadb":
        source, json_ranges, empty = f"(SELECT seq AS s FROM seq_{first}_to_{last - 1}) g", ranges, "%s"
    else:
        source, json_ranges, empty = f"generate_series({first}, {last - 1}) AS g(s)", ranges + "::jsonb", "%s::jsonb"
    for i in range(PIPELINES):
        pipeline_id = f"fill_{i:03d}"
        with store.transaction() as cur:
            if first == 0:
                cur.execute("INSERT INTO eo_pipeline (pipeline_id, epoch, mode) VALUES (%s, 1, 'continuous')",
                            (pipeline_id,))
                cur.execute("INSERT INTO eo_offset (pipeline_id, topic, kafka_partition, next_offset, batch_id) "
                            "VALUES (%s, %s, 0, 0, -1)", (pipeline_id, topic_name))
            cur.execute(
                "INSERT INTO eo_batch (pipeline_id, batch_id, run_id, run_key, epoch, state, ranges, skipped, "
                "records_in, rows_out, dead_letters, committed_at) "
                f"SELECT %s, s, CONCAT('scheduled__', s), CONCAT('scheduled__', s), 1, 'committed', {json_ranges}, "
                f"{empty}, 10, 10, 0, CURRENT_TIMESTAMP(3) FROM {source}", (pipeline_id, "[]"))
            cur.execute("UPDATE eo_offset SET next_offset = %s, batch_id = %s WHERE pipeline_id = %s",
                        (last * 10, last - 1, pipeline_id))
    if kind == "mariadb":
        with store.transaction() as cur:
            cur.execute("ANALYZE TABLE eo_batch")
            cur.fetchall()
    else:  # VACUUM runs outside a transaction; what autovacuum does to a store filled over months
        with _admin_connect(kind, conn_id) as conn:
            conn.execute("VACUUM ANALYZE eo_batch")
    return time.monotonic() - started


def timed(call: Callable[[], Any], repeat: int) -> float:
    """The median seconds of ``repeat`` calls (after one unmeasured warm-up call)."""
    call()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(ops: PipelineOperations, store: SqlOffsetStore, probe: str, epoch: int, topic_name: str,
            repeat: int) -> dict[str, float]:
    return {
        "pipelines": timed(ops.pipelines, repeat),
        "status": timed(lambda: ops.status(probe), repeat),
        "verify": timed(lambda: ops.verify(probe), repeat),
        "plan + commit": timed(lambda: plan_and_commit(store, probe, epoch, topic_name), repeat),
        "DAG tab": timed(lambda: dag_tab(ops), repeat),
    }


def dag_tab(ops: PipelineOperations) -> list[Any]:
    """What the Exactly-once tab reads for the probe's DAG (``plugins/exactly_once.py``'s ``_read_pages``): the DAG's
    pipelines, then each one's page with ``verify``, as many batches as the tab's default ``ui_batch_limit``."""
    owned = ops.pipelines_of_dag(PROBE_OWNER.dag_id, [PROBE_OWNER.task_id])
    assert owned, "the probe pipeline is the probe DAG's"
    return [ops.page(pipeline_id, UI_BATCH_LIMIT, task_id, verify=True) for pipeline_id, task_id in owned.items()]


def run_store(kind: str, rows: int, repeat: int) -> dict[str, Any]:
    with throwaway_store(kind) as (conn_id, database), topic() as topic_name:
        ops = pipeline_operations(conn_id, actor="store_size")
        store = ops.store
        assert isinstance(store, SqlOffsetStore)
        probe = "probe"
        epoch = store.take_pipeline(probe, owner=PROBE_OWNER)
        for _ in range(PROBE_BATCHES):
            plan_and_commit(store, probe, epoch, topic_name)
        per = max(2, rows // PIPELINES)
        fill(store, kind, conn_id, 0, 1, topic_name)  # the same pipelines, one batch each: only the history differs
        empty = measure(ops, store, probe, epoch, topic_name, repeat)
        fill_s = fill(store, kind, conn_id, 1, per, topic_name)
        filled = measure(ops, store, probe, epoch, topic_name, repeat)
        big = timed(lambda: ops.verify("fill_000"), 1)
        return {"store": kind, "database": database, "topic": topic_name, "rows": rows, "fill_s": fill_s,
                "empty": empty, "filled": filled,
                "ratio": {k: filled[k] / empty[k] for k in empty}, "verify_filled_pipeline": big,
                "filled_pipeline_batches": per}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="batch-log rows to fill (default 1,000,000)")
    parser.add_argument("--short", action="store_true", help="20,000 rows, 3 repeats (the suite's setting)")
    parser.add_argument("--repeat", type=int, default=7, help="calls per measurement (the median is printed)")
    parser.add_argument("--store", choices=[*KINDS, "both"], default="both")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the results as JSON too")
    args = parser.parse_args(argv)
    rows, repeat = (20_000, 3) if args.short else (args.rows, args.repeat)
    results = [run_store(kind, rows, repeat) for kind in (KINDS if args.store == "both" else [args.store])]
    for r in results:
        print(f"\n{r['store']}: {r['rows']:,} batch-log rows across {PIPELINES} pipelines (filled in "
              f"{r['fill_s']:.1f}s; empty: the same {PIPELINES} pipelines with one batch each); the probe pipeline "
              f"has {PROBE_BATCHES}+ batches")
        print(f"  {'operation':<16}{'empty ms':>10}{'filled ms':>11}{'ratio':>8}")
        for name in r["empty"]:
            ratio = r["ratio"][name]
            flag = "" if ratio <= TARGET_RATIO else f"  over {TARGET_RATIO}x"
            print(f"  {name:<16}{r['empty'][name] * 1000:>10.1f}{r['filled'][name] * 1000:>11.1f}{ratio:>7.2f}x{flag}")
        print(f"  verify of a filled pipeline ({r['filled_pipeline_batches']:,} batches): "
              f"{r['verify_filled_pipeline'] * 1000:.0f} ms")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
