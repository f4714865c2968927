"""Throughput of our sinks next to the at-least-once tools people use today and the machine's limits, in one run.

    . .stack/env && .venv/bin/python scripts/benchmark.py --sizes 1000000 --json bench.json --chart bench.png
    . .stack/env && .venv/bin/python scripts/benchmark.py --sizes 10000,100000,1000000 --parallelism 2,4
    make bench                      # the full run of the README

Every point of the sweep (a batch size and a writer parallelism) runs in its own process, so the driver's peak
memory is that point's. A point produces N page views to a fresh topic (N lines for the Kafka sink) and runs,
each on the same data and an identical fresh table:

- the limits: ``r_kafka`` (Spark reads and counts the ranges: no parse, no write) and ``r_db`` (the fastest
  load of the same rows into the same table from the same number of connections: multi-row INSERT or
  ``LOAD DATA LOCAL INFILE``, whichever is faster), ``r_db_pg`` for PostgreSQL (``COPY .. FROM STDIN`` of the
  same rows, same connections); the limit of a pipeline is min(r_kafka, r_db[_pg]) for its shape, and, since Spark
  and the database share the machine's cores, the shared-core limit 1 / (1/r_kafka + 1/r_db[_pg]) (each record read,
  then written, on the same cores);
- the peers (at-least-once), per job (:data:`PEERS_OF`): for the events' shape, Spark Structured Streaming
  (``readStream`` + ``trigger(availableNow=True)`` + a checkpoint + ``foreachBatch`` upserting with our multi-row
  statements), Spark's JDBC writer (``df.write.jdbc`` append, MariaDB Connector/J from Maven Central) and Airflow's
  Kafka provider (``ConsumeFromTopicOperator`` with an ``apply_function_batch`` that upserts); for the per-app
  counts, Spark's JDBC append of the aggregated rows; for the Kafka sink, Spark's own Kafka writer
  (``df.write.format("kafka")``, no transactions) of the same per-window counts; for the PostgreSQL sinks,
  Spark's JDBC writer into PostgreSQL (``spark_jdbc_append_pg``, append, PostgreSQL's JDBC driver from Maven
  Central); for the Delta Lake sink, a Spark batch ``df.write.format("delta").mode("append")`` of the same parsed
  events (``spark_delta_append``) and Structured Streaming from the topic into Delta's own streaming sink
  (``structured_streaming_delta``: ``writeStream.format("delta")`` + ``availableNow`` + a checkpoint, no
  ``foreachBatch``); for the Iceberg sink the same two ways into an Iceberg table of a Hadoop catalog
  (``spark_iceberg_append``: ``df.writeTo(table).append()``; ``structured_streaming_iceberg``:
  ``writeStream.format("iceberg")`` + ``availableNow`` + a checkpoint);
- ours (exactly once): the upsert sink and the XA sink into ``page_view_events``' shape (and the XA sink reading
  the same events as Confluent-framed Avro, ``eo_xa_events_avro``, with the JSON job as its peer), the XA sink's
  per-app counts (``app_pv``), the Kafka transactional sink (``ip_counts``), and every record bad and dead-lettered by
  the XA sink, written by the executors (``eo_xa_dead_letters``) and, for comparison, streamed through the driver
  (``eo_xa_dead_letters_via_driver``, the path of sinks without an executor-side dead-letter writer); on
  PostgreSQL, the upsert sink (``eo_pg_upsert``) and the two-phase sink (``eo_pg_two_phase``) into
  ``page_view_events``' shape, with the offset store on the same PostgreSQL database (as ``page_views_pg``); the
  Delta Lake sink appending (``eo_delta_append``) and MERGE on ``event_id`` (``eo_delta_merge``) into a fresh table
  on the local disk, and the Iceberg sink the same two ways (``eo_iceberg_append``, ``eo_iceberg_merge``). The Delta
  jobs and the Iceberg jobs run in a child process of the point, one per format: Spark takes a format's jars, SQL
  extension and catalog only when a session starts, and the point's session (the other jobs') starts without them;
- change data capture (``scripts/bench/cdc.py``), on a topic of its own: N synthetic Debezium change events (70%
  updates over N / 10 keys, 10% deletes, the rest creates) applied by our pipeline with ``changes="debezium"`` to
  MySQL (``eo_cdc_upsert``) and PostgreSQL (``eo_cdc_upsert_pg``), each against Structured Streaming's
  ``foreachBatch`` into the same database through a staging table (``structured_streaming_cdc[_pg]``), every table
  compared with the events' ground truth; ``--cdc-phases`` measures our job's phases apart.

Every job checks its output (row count, or the true counts) before its time counts. It prints records/s, the ratio to
the best peer of the job (``peer`` names it; dead letters also to the XA sink's good-record rate) and the fraction of
the limit and of the shared-core limit (none for the Delta jobs: they run in another JVM than R_kafka's, and the
local disk's own rate is not measured), and with ``--json``/``--chart`` writes them (with the seconds per phase and
the driver's peak memory) as JSON and as a PNG. Numbers, not assertions: compare ratios within one run.

The code is in the package ``scripts/bench``, a module per part: ``names`` (the jobs and their peers), ``common``
(what every job uses), ``limits``, ``peers``, ``ours``, ``cdc`` and ``cdc_jobs`` (change data capture),
``lakehouse`` (Delta Lake and Iceberg), ``point`` (one point of the sweep), ``report`` (ratios, tables, chart),
``cli`` (this command line).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # examples/: producers and ground truths

from bench.cli import main

if __name__ == "__main__":
    main(__doc__ or "")
