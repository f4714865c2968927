"""The benchmark's change-data-capture jobs (issue 43, item 7): Debezium change events applied to MySQL and PostgreSQL.

The events are synthetic, in the shape a real Debezium PostgreSQL connector writes with Connect's JSON converter
without the schema wrapper (``schemas.enable=false``; recorded examples: ``tests/fixtures/debezium/without_schema``):
``before`` / ``after`` (REPLICA IDENTITY FULL: an update's and a delete's ``before`` is the whole old row), ``op``,
``source`` with ``lsn`` and ``sequence`` = ``["<last commit LSN>","<LSN>"]``, both increasing in source order,
``transaction``, and the key ``{"id": ..}`` as the record's key (so each key's changes keep their order in one
partition). The table is ``(id INT primary key, name STRING, qty BIGINT)``; of the events 70% are updates over
``events / 10`` keys (100,000 at 1,000,000 events), 10% deletes, the rest creates: an update or a delete names a
key that exists, a create one that does not (never created, or deleted: then it is created again). When the mix
cannot be kept (no row to update yet; every key exists) the other kind is written; the counts are printed. No
tombstones (``tombstones.on.delete=false``): a delete is one record.

The jobs, each into a fresh table of the same shape (the ground truth is the last state of each key, computed while
the events are generated; every job's table must equal it row for row before its time counts):

- ``eo_cdc_upsert`` / ``eo_cdc_upsert_pg``: our pipeline, ``changes="debezium"`` into ``MySqlUpsertSink`` /
  ``PostgresUpsertSink`` (exactly once: a change applies only when its position is newer than its row's);
- ``structured_streaming_cdc`` / ``structured_streaming_cdc_pg``, the peers, as people write them: Structured
  Streaming (``readStream`` + ``trigger(availableNow=True)`` + a checkpoint) with ``foreachBatch``: parse the JSON,
  keep each key's latest change of the micro-batch (``row_number`` over the key by ``source.lsn`` descending), write
  those with Spark's JDBC writer into a staging table, then one ``INSERT .. SELECT .. ON DUPLICATE KEY UPDATE`` /
  ``ON CONFLICT DO UPDATE`` of the upserts and one ``DELETE .. JOIN`` / ``DELETE .. USING`` of the deletes, in one
  transaction (at least once, no position guard: a replayed micro-batch or an older change re-sent rolls rows back).

``profile_ours`` (``--cdc-phases``) splits our job's time into its phases by running its stages again, untimed: read,
+ parse, + newest per key as Spark jobs that write nothing (``format("noop")``), the position look-up on the driver;
the write (the output's, then the positions', by the same tasks) is what is left of the job's write job.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_eo.core.config import ParseConfig
from airflow_eo.sinks import MySqlUpsertSink, PostgresUpsertSink

#: The source table's columns as Spark DDL (``schema=`` of the pipeline).
ROW = "id INT, name STRING, qty BIGINT"
MYSQL_DDL = "CREATE TABLE `{table}` (id INT NOT NULL PRIMARY KEY, name VARCHAR(64) NULL, qty BIGINT NULL) ENGINE=InnoDB"
PG_DDL = 'CREATE TABLE "{table}" (id INT PRIMARY KEY, name TEXT, qty BIGINT)'
MYSQL_STAGING_DDL = "CREATE TABLE `{table}` (id INT NOT NULL, name VARCHAR(64) NULL, qty BIGINT NULL, op CHAR(1))"
PG_STAGING_DDL = 'CREATE TABLE "{table}" (id INT NOT NULL, name TEXT, qty BIGINT, op CHAR(1))'
OURS = ("eo_cdc_upsert", "eo_cdc_upsert_pg")
PEERS = ("structured_streaming_cdc", "structured_streaming_cdc_pg")
JOBS = (*PEERS, *OURS)
#: Each job against the peer on its own database.
PEERS_OF = {name: (f"structured_streaming_cdc{'_pg' if name.endswith('_pg') else ''}",) for name in JOBS}
#: The mix of the events: updates, deletes, the rest creates.
UPDATES, DELETES = 0.7, 0.1
#: Debezium's names in the events (``topic.prefix``, database, schema, table).
SERVER, DB, SCHEMA, TABLE = "bench_cdc", "airflow_eo", "public", "items"


def database_of(name: str) -> str:
    """``postgres`` for a ``*_pg`` job, else ``mysql``."""
    return "postgres" if name.endswith("_pg") else "mysql"


@dataclass
class Changes:
    """A topic of change events and the state they leave: the table's ground truth."""

    topic: str
    events: int
    keys: int
    truth: dict[int, tuple[str, int]] = field(repr=False)
    ops: Counter[str] = field(default_factory=Counter)


class _Pool:
    """A set of keys with a random pick and removal in O(1)."""

    def __init__(self, keys: list[int]) -> None:
        self.keys, self.at = keys, {k: i for i, k in enumerate(keys)}

    def __len__(self) -> int:
        return len(self.keys)

    def pick(self, rng: random.Random) -> int:
        return self.keys[rng.randrange(len(self.keys))]

    def add(self, key: int) -> None:
        self.at[key] = len(self.keys)
        self.keys.append(key)

    def remove(self, key: int) -> None:
        i, last = self.at.pop(key), self.keys.pop()
        if last != key:
            self.keys[i], self.at[last] = last, i


def _image(key: int, row: tuple[str, int]) -> dict[str, Any]:
    return {"id": key, "name": row[0], "qty": row[1]}


def change_events(events: int, keys: int, seed: int = 0) -> tuple[list[tuple[bytes, bytes]], Changes]:
    """``events`` change events as (key, value) records in source order, and their ground truth (topic unset)."""
    out: list[tuple[bytes, bytes]] = []
    truth = generate(events, keys, seed, lambda key, value: out.append((key, value)))
    return out, truth


def generate(events: int, keys: int, seed: int, emit: Callable[[bytes, bytes], None]) -> Changes:
    """Calls ``emit(key, value)`` for each change event, in source order; returns the ground truth. Each transaction
    holds one to three changes (of different keys); a transaction's changes carry its first LSN as their last
    commit LSN (as the recorded events of a quiet server do), the very first one null (Debezium's first streamed
    transaction)."""
    rng = random.Random(seed)
    free, live = _Pool(list(range(1, keys + 1))), _Pool([])
    state: dict[int, tuple[str, int]] = {}
    ops: Counter[str] = Counter()
    lsn, tx_id, at_ms = 27_048_864, 2_275, 1_795_817_551_306
    sent = 0
    while sent < events:
        size = min(rng.choice((1, 1, 1, 2, 3)), events - sent)
        lsn += rng.randrange(96, 512)
        tx_id += 1
        at_ms += rng.randrange(0, 3)
        first, touched = lsn, set()
        for order in range(1, size + 1):
            roll = rng.random()
            op = "u" if roll < UPDATES else "d" if roll < UPDATES + DELETES else "c"
            live_left = len(live) - sum(k in live.at for k in touched)
            free_left = len(free) - sum(k in free.at for k in touched)
            if op != "c" and not live_left:
                op = "c"
            if op == "c" and not free_left:
                op = "u"
                if not live_left:
                    break  # every key is changed by this transaction already
            pool = free if op == "c" else live
            key = pool.pick(rng)
            while key in touched:  # one change per key and transaction: its order in the topic is its key's
                key = pool.pick(rng)
            touched.add(key)
            before = _image(key, state[key]) if op != "c" else None
            if op == "d":
                del state[key]
                live.remove(key)
                free.add(key)
                after = None
            else:
                if op == "c":
                    free.remove(key)
                    live.add(key)
                state[key] = (f"item {key} v{sent}", rng.randrange(1_000_000))
                after = _image(key, state[key])
            ops[op] += 1
            if order > 1:
                lsn += rng.randrange(96, 256)
            last_commit = None if sent == 0 else str(first)
            ts_us = at_ms * 1000 + rng.randrange(1000)
            sequence = json.dumps([last_commit, str(lsn)], separators=(",", ":"))
            value = {
                "before": before, "after": after,
                "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": SERVER, "ts_ms": at_ms,
                           "snapshot": "false", "db": DB, "sequence": sequence,
                           "ts_us": ts_us, "ts_ns": ts_us * 1000, "schema": SCHEMA, "table": TABLE, "txId": tx_id,
                           "lsn": lsn, "xmin": None, "origin": None, "origin_lsn": None},
                "transaction": {"id": f"{tx_id}:{lsn}", "total_order": order, "data_collection_order": order},
                "op": op, "ts_ms": at_ms + 5, "ts_us": (at_ms + 5) * 1000 + 17,
                "ts_ns": (at_ms + 5) * 1_000_000 + 17_000}
            emit(json.dumps({"id": key}, separators=(",", ":")).encode(),
                 json.dumps(value, separators=(",", ":")).encode())
            sent += 1
    return Changes("", events, keys, state, ops)


def produce_changes(bootstrap: str, events: int, topic: str | None = None, keys: int | None = None, seed: int = 0,
                    partitions: int = 3) -> Changes:
    """:func:`generate`'s events into a fresh topic of ``partitions`` partitions, keyed by the row's key (the
    default partitioner: each key's changes in one partition, in order: an idempotent producer)."""
    from confluent_kafka import Producer

    from airflow_eo.examples.topics import ensure_topic

    topic = topic or f"bench_cdc_{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000,
                         "compression.type": "lz4"})

    def send(key: bytes, value: bytes) -> None:
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.1)
        producer.poll(0)

    changes = generate(events, keys or max(1, events // 10), seed, send)
    if producer.flush(120) != 0:
        raise RuntimeError("not every change event was delivered within 120s")
    changes.topic = topic
    return changes


# --------------------------------------------------------------------------- tables


def connect(database: str, kwargs: Mapping[str, Any]) -> Any:
    """An autocommit connection to the MySQL / PostgreSQL database."""
    if database == "postgres":
        import psycopg

        return psycopg.connect(**kwargs, autocommit=True)
    from airflow_eo.mysql.connection import connect as mysql_connect

    return mysql_connect(dict(kwargs), autocommit=True)


def run_sql(database: str, kwargs: Mapping[str, Any], *statements: str) -> list[tuple]:
    """The statements in one connection; the last one's rows."""
    conn = connect(database, kwargs)
    try:
        rows: list[tuple] = []
        cur = conn.cursor()
        for statement in statements:
            cur.execute(statement)
            rows = list(cur.fetchall()) if cur.description else []
        return rows
    finally:
        conn.close()


def quote(database: str, table: str) -> str:
    return f'"{table}"' if database == "postgres" else f"`{table}`"


def create_table(database: str, kwargs: Mapping[str, Any], label: str, staging: bool = False) -> str:
    """A fresh target table (or a staging table: no key, an ``op`` column) of the source table's shape."""
    table = f"bench_{label}_{uuid.uuid4().hex[:6]}"
    ddl = ((PG_STAGING_DDL if staging else PG_DDL) if database == "postgres" else
           (MYSQL_STAGING_DDL if staging else MYSQL_DDL))
    run_sql(database, kwargs, ddl.format(table=table))
    return table


def check_target(database: str, kwargs: Mapping[str, Any], table: str, truth: Mapping[int, tuple[str, int]]) -> str:
    """The table equals the ground truth row for row (returns the job's note saying so), or AssertionError saying
    how it differs."""
    got = {int(i): (n, None if q is None else int(q))
           for i, n, q in run_sql(database, kwargs, f"SELECT id, name, qty FROM {quote(database, table)}")}
    if got == truth:
        return f"table = the source's last state ({len(truth):,} rows)"
    missing = [k for k in truth if k not in got]
    extra = [k for k in got if k not in truth]
    wrong = [k for k in truth if k in got and got[k] != truth[k]]
    example = wrong[:1] and f"; e.g. id {wrong[0]}: {got[wrong[0]]} instead of {truth[wrong[0]]}"
    raise AssertionError(f"{database} table {table} is not the source table's last state: {len(missing)} row(s) "
                         f"missing, {len(extra)} too many, {len(wrong)} with other values (of {len(truth)})"
                         f"{example or ''}: this job's output is wrong, its time means nothing")


def sink(database: str, table: str, conn_id: str) -> MySqlUpsertSink | PostgresUpsertSink:
    """Our sink into ``table``, keyed by the source's primary key."""
    if database == "postgres":
        return PostgresUpsertSink(table=table, key_columns=["id"], conn_id=conn_id)
    return MySqlUpsertSink(table=table, key_columns=["id"])


def parse_config(parallelism: int) -> ParseConfig:
    """``changes="debezium"`` over :data:`ROW`, as ``KafkaMicroBatchOperator`` builds it for the sinks above."""
    return ParseConfig("json", ROW, write_partitions=parallelism, changes="debezium", change_keys=("id",))


def forget_positions(database: str, kwargs: Mapping[str, Any], pipeline_id: str) -> None:
    """The change positions our job left for ``pipeline_id`` (a later job's look-ups and writes would meet them)."""
    from airflow_eo.core.dedup import seen_pipeline_key
    from airflow_eo.sqlsink.change_positions import CHANGE_POSITION_TABLE

    conn = connect(database, kwargs)
    try:
        conn.cursor().execute(f"DELETE FROM {quote(database, CHANGE_POSITION_TABLE)} WHERE pipeline_key = %s",
                              (seen_pipeline_key(pipeline_id),))
    finally:
        conn.close()


# --------------------------------------------------------------------------- the peer


def peer_newest(df: Any) -> Any:
    """A micro-batch's records (Kafka's ``value``) as each key's latest change: ``id, name, qty, op``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    image = "STRUCT<id: INT, name: STRING, qty: BIGINT>"
    schema = f"before {image}, after {image}, op STRING, source STRUCT<lsn: BIGINT, sequence: STRING>"
    e = F.from_json(F.col("value").cast("string"), schema).alias("e")
    changes = df.select(e).select(
        F.coalesce(F.col("e.after.id"), F.col("e.before.id")).alias("id"), F.col("e.after.name").alias("name"),
        F.col("e.after.qty").alias("qty"), F.col("e.op").alias("op"), F.col("e.source.lsn").alias("lsn"))
    latest = Window.partitionBy("id").orderBy(F.col("lsn").desc())
    return (changes.where(F.col("op").isNotNull())
            .withColumn("n", F.row_number().over(latest)).where(F.col("n") == 1).drop("n", "lsn"))


def merge_statements(database: str, table: str, staging: str) -> tuple[str, str]:
    """The upsert of the staging table's creates and updates, and the delete of its deletes."""
    t, s = quote(database, table), quote(database, staging)
    if database == "postgres":
        return (f"INSERT INTO {t} (id, name, qty) SELECT id, name, qty FROM {s} WHERE op <> 'd' "
                "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, qty = EXCLUDED.qty",
                f"DELETE FROM {t} USING {s} WHERE {t}.id = {s}.id AND {s}.op = 'd'")
    return (f"INSERT INTO {t} (id, name, qty) SELECT id, name, qty FROM {s} WHERE op <> 'd' "
            "ON DUPLICATE KEY UPDATE name = VALUES(name), qty = VALUES(qty)",
            f"DELETE {t} FROM {t} JOIN {s} ON {t}.id = {s}.id WHERE {s}.op = 'd'")


def jdbc_target(database: str, kwargs: Mapping[str, Any], rows_per_batch: int) -> tuple[str, dict[str, str]]:
    """Spark's JDBC URL and properties for the database (MariaDB Connector/J, pgjdbc), as the other peers use."""
    if database == "postgres":
        return (f"jdbc:postgresql://{kwargs['host']}:{kwargs['port']}/{kwargs['dbname']}",
                {"user": kwargs["user"], "password": kwargs["password"], "driver": "org.postgresql.Driver",
                 "batchsize": str(rows_per_batch), "reWriteBatchedInserts": "true"})
    return (f"jdbc:mysql://{kwargs['host']}:{kwargs['port']}/{kwargs['database']}?permitMysqlScheme",
            {"user": kwargs["user"], "password": kwargs["password"], "driver": "org.mariadb.jdbc.Driver",
             "batchsize": str(rows_per_batch)})


def structured_streaming_cdc(spark: Any, stream: Any, database: str, kwargs: Mapping[str, Any], table: str,
                             parallelism: int, rows_per_batch: int, checkpoint: Path) -> tuple[float, dict[str, float]]:
    """The peer over ``stream`` (the topic's ``readStream``) into ``table``: seconds, and the seconds of its
    micro-batches' parts (``stage``: parse, latest per key and the JDBC write into staging, one Spark job;
    ``merge``: the two statements)."""
    staging = create_table(database, kwargs, "cdcstage", staging=True)
    url, properties = jdbc_target(database, kwargs, rows_per_batch)
    upsert, delete = merge_statements(database, table, staging)
    phases = {"stage": 0.0, "merge": 0.0}

    def apply(df: Any, epoch_id: int) -> None:
        t0 = time.monotonic()
        (peer_newest(df).write.mode("overwrite").option("truncate", "true").option("numPartitions", parallelism)
         .jdbc(url, quote(database, staging), properties=properties))
        t1 = time.monotonic()
        conn = connect(database, kwargs)
        try:
            if database == "postgres":
                with conn.transaction():
                    conn.execute(upsert)
                    conn.execute(delete)
            else:
                conn.begin()
                with conn.cursor() as cur:
                    cur.execute(upsert)
                    cur.execute(delete)
                conn.commit()
        finally:
            conn.close()
        phases["stage"] += t1 - t0
        phases["merge"] += time.monotonic() - t1

    try:
        started = time.monotonic()
        query = (stream.writeStream.foreachBatch(apply)
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True)
                 .start())
        query.awaitTermination()
        seconds = time.monotonic() - started
    finally:
        run_sql(database, kwargs, f"DROP TABLE IF EXISTS {quote(database, staging)}")
    return seconds, {k: round(v, 3) for k, v in phases.items()}


# --------------------------------------------------------------------------- where our time goes


#: The database-independent stages of :func:`profile_ours`, per topic (measured once for both databases' jobs).
_STAGES: dict[str, dict[str, float]] = {}


def profile_ours(eng: Any, spark: Any, adapter: Any, batch: Any, job_phases: Mapping[str, float]) -> dict[str, float]:
    """Where our job's time went, its stages run again apart (untimed by the job), each Spark job writing nothing
    (``noop``), each run twice and the faster kept (the machine is shared). Cumulative: ``read``; + ``parse``; + the
    newest change per key and its key id (``newest``: a look-up that finds nothing, asking no database). The look-up of
    the newest keys' positions (``p_lookup``: a pipeline without any, as the measured run's) is timed on the driver,
    all keys from one connection (the job's tasks split them). ``p_write``: the job's one Spark job (``write``: read,
    parse, newest, look-up, the output's upserts and deletes and the positions, in the same tasks) less read + parse
    + newest and the look-up's share per task."""
    from pyspark.sql import functions as F

    from airflow_eo.core.abilities import ChangePositions, role
    from airflow_eo.spark.changes import KEY_ID, SKIP, newest_changes, with_key_ids
    from airflow_eo.spark.refused_rows import without_raw_fields

    changes = role(adapter, ChangePositions, "changes")
    partitions = eng.parse.write_partitions

    def nothing_applied(key_ids: Any) -> dict[bytes, bytes]:  # nested: pickled by value (no module on the workers)
        return {}

    def run(df: Any) -> float:
        best = float("inf")
        for _ in range(2):
            started = time.monotonic()
            df.write.format("noop").mode("overwrite").save()
            best = min(best, time.monotonic() - started)
        return best

    topic = batch.ranges[0].topic
    raw = eng.read(spark, batch)
    parsed, _ = eng.parse_records(spark, raw)
    rows = without_raw_fields(parsed.where(~F.col(SKIP)).drop(SKIP))
    keyed = with_key_ids(rows, changes.key_columns)
    if topic not in _STAGES:
        read, parse = run(raw), run(rows)
        newest = run(newest_changes(rows, changes.key_columns, nothing_applied, partitions))
        _STAGES[topic] = {"p_read": read, "p_parse": parse - read, "p_newest": newest - parse, "through_newest": newest}
    stages = _STAGES[topic]
    ids = [bytes(r[0]) for r in keyed.select(KEY_ID).distinct().collect()]
    lookup = changes.position_lookup(batch)
    started = time.monotonic()
    lookup(ids)
    looked = time.monotonic() - started
    write = job_phases.get("write", 0.0) - stages["through_newest"] - looked / partitions
    return {**{k: round(v, 3) for k, v in stages.items() if k != "through_newest"}, "p_lookup": round(looked, 3),
            "p_write": round(write, 3), "p_lookup_keys": len(ids)}
