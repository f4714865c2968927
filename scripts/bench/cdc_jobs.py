"""The change-data-capture jobs of a point (scripts/bench/cdc.py): ours and Structured Streaming's, per
database."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.ranges import spark_offsets
from airflow_eo.hooks.connected_sinks import build_sink
from bench import cdc
from bench.common import (
    PG_CONN_ID,
    ROWS_PER_STATEMENT,
    Job,
    drop_made_tables,
    engine,
    kafka_stream,
    made_pg_tables,
    made_tables,
    mysql_kwargs,
    pg_kwargs,
    spark_hook,
    whole_topic,
)
from bench.ours import ours


def _cdc_database(name: str) -> tuple[str, dict[str, Any], list[str]]:
    """The database of a change-data-capture job, its login and the list its tables are dropped from."""
    database = cdc.database_of(name)
    postgres = database == "postgres"
    return database, pg_kwargs() if postgres else mysql_kwargs(), made_pg_tables if postgres else made_tables


def cdc_peer(name: str, changes: cdc.Changes, parallelism: int, workdir: Path) -> Job:
    """``structured_streaming_cdc[_pg]`` (scripts/bench/cdc.py) into a fresh table; it must equal the ground truth."""
    database, kwargs, made = _cdc_database(name)
    table = cdc.create_table(database, kwargs, "sscdc")
    made.append(table)
    spark = spark_hook().get_conn()
    starting, _ = spark_offsets(whole_topic(changes.topic))
    seconds, phases = cdc.structured_streaming_cdc(spark, kafka_stream(spark, changes.topic, starting), database,
                                                   kwargs, table, parallelism, ROWS_PER_STATEMENT,
                                                   workdir / f"checkpoint_{table}")
    return Job(name, changes.events, parallelism, seconds, phases,
               note=cdc.check_target(database, kwargs, table, changes.truth))


def eo_cdc(name: str, changes: cdc.Changes, parallelism: int, phases: bool = False) -> Job:
    """``eo_cdc_upsert[_pg]``: our pipeline with ``changes="debezium"`` into a fresh table (the offset store on the
    sink's database, as ``eo_pg_upsert``); it must equal the ground truth. ``phases``: then measured apart."""
    database, kwargs, made = _cdc_database(name)
    table = cdc.create_table(database, kwargs, "eocdc")
    made.append(table)
    store = PG_CONN_ID if database == "postgres" else None
    spec, parse = cdc.sink(database, table, PG_CONN_ID), cdc.parse_config(parallelism)
    try:
        job = ours(name, spec, None, changes.topic, changes.events, parallelism, parse=parse, store_conn_id=store)
        job.note = cdc.check_target(database, kwargs, table, changes.truth)
        if phases:
            profile = f"bench_cdc_profile_{uuid.uuid4().hex[:8]}"
            job.phases.update(cdc.profile_ours(engine(parallelism, parse=parse), spark_hook().get_conn(),
                                               build_sink(spec, profile, store),
                                               BatchContext(profile, 0, "bench", 0, whole_topic(changes.topic)),
                                               job.phases))
    finally:
        cdc.forget_positions(database, kwargs, f"bench_{name}_{changes.topic}")  # ours()'s pipeline id
    return job


def warm_cdc(bootstrap: str, names: Sequence[str], parallelism: int, events: int, workdir: Path) -> None:
    """The change-data-capture jobs once on a small topic, not timed (as :func:`warm_parse_paths`)."""
    changes = cdc.produce_changes(bootstrap, events, topic=f"bench_warm_cdc_{uuid.uuid4().hex[:8]}")
    try:
        for name in names:
            (eo_cdc if name in cdc.OURS else lambda n, c, p: cdc_peer(n, c, p, workdir))(name, changes, parallelism)
    finally:
        drop_made_tables()
