"""The benchmark's small setting: every job runs and checks its output, the JSON and the chart are written.

Nothing here is about speed (the machine is shared); it keeps ``scripts/benchmark.py`` from rotting.

The Delta Lake jobs (``eo_delta_append``, ``eo_delta_merge`` and their peers) are left out: they run in a Spark
session of their own, started with Delta's jars and extension, and warm each job up first. At 3,000 events, on the
two-core machine loaded by other tests, the whole setting took 211 s with them (their child process 89 s) against
117 s without: far over the ~20 s they could cost here. The Delta sink's own tests
(``tests/integration/test_delta_sink.py``) prove its output; ``make bench`` and ``--only`` run these jobs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = {"r_kafka", "r_kafka_lines", "r_db", "structured_streaming_foreach_batch", "spark_jdbc_append",
        "airflow_consume_from_topic", "spark_jdbc_append_counts", "spark_kafka_writer", "eo_upsert", "eo_xa_events",
        "eo_xa_counts", "eo_kafka_txn", "eo_xa_dead_letters", "eo_xa_dead_letters_via_driver", "eo_empty_batch",
        "r_db_pg", "spark_jdbc_append_pg", "eo_pg_upsert", "eo_pg_two_phase", "eo_xa_events_avro",
        "eo_xa_events_dedup", "structured_streaming_dedup", "spark_anti_join_dedup", "structured_streaming_cdc",
        "eo_cdc_upsert", "structured_streaming_cdc_pg", "eo_cdc_upsert_pg"}
EVENTS_PEERS = ("structured_streaming_foreach_batch", "spark_jdbc_append", "airflow_consume_from_topic")


def test_the_benchmark_runs_every_job_on_a_small_batch(tmp_path, bootstrap, airflow_db):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    only = ",".join(sorted(JOBS - {"r_kafka_lines"}))  # r_kafka's second topic comes with it
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark.py"), "--sizes", "3000",
                           "--parallelism", "2", "--only", only, "--json", str(out), "--chart", str(png),
                           "--cdc-phases"],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    jobs = {job["name"]: job for job in json.loads(out.read_text())}
    assert set(jobs) == JOBS
    empty = jobs.pop("eo_empty_batch")  # timed in a fresh process, which checked that no JVM started
    assert empty["events"] == 0 and empty["seconds"] > 0 and empty["note"] == "no Spark started"
    assert {"plan", "commit", "first_run"} <= set(empty["phases"]) and empty["ratio_to_best_peer"] is None
    for job in jobs.values():
        assert job["events"] == 3000 and job["records_per_s"] > 0 and job["parallelism"] == 2
        assert set(job["driver_peak_rss_mb"]) == {"python", "jvm"} and job["spark"] == "local"
    for name in ("structured_streaming_foreach_batch", "spark_jdbc_append", "airflow_consume_from_topic",
                 "eo_upsert", "eo_xa_events", "eo_xa_events_avro", "eo_xa_counts", "eo_kafka_txn",
                 "spark_jdbc_append_pg", "eo_pg_upsert", "eo_pg_two_phase"):
        assert jobs[name]["ratio_to_best_peer"] is not None and jobs[name]["fraction_of_limit"] is not None
    assert max(jobs[p]["ratio_to_best_peer"] for p in EVENTS_PEERS) == 1.0
    # Both limits: the shared-core one (reading and writing on the same cores) is below min(R_kafka, R_db).
    for name in ("eo_xa_events", "eo_upsert", "spark_jdbc_append", "eo_pg_upsert", "eo_pg_two_phase"):
        assert jobs[name]["fraction_of_shared_limit"] > jobs[name]["fraction_of_limit"] > 0, jobs[name]
    kafka, db = jobs["r_kafka"]["records_per_s"], jobs["r_db"]["records_per_s"]
    assert jobs["eo_xa_events"]["fraction_of_shared_limit"] == pytest.approx(
        jobs["eo_xa_events"]["records_per_s"] * (1 / kafka + 1 / db), abs=0.001)
    # Each job against the best peer of its own shape.
    assert {jobs[n]["peer"] for n in ("eo_upsert", "eo_xa_events", "eo_xa_dead_letters")} <= set(EVENTS_PEERS)
    assert jobs["eo_xa_counts"]["peer"] == "spark_jdbc_append_counts"
    # The same events as Confluent-framed Avro, against the same XA pipeline on JSON values (issue 21's ratio).
    assert jobs["eo_xa_events_avro"]["peer"] == "eo_xa_events"
    assert {"plan", "commit", "finalize", "write"} <= set(jobs["eo_xa_events_avro"]["phases"])
    # dedup_key on the same events with a tenth re-sent, the seen-id table holding a previous run's ids (the job
    # checks the table holds each event once and every copy was reported), against the tools that drop copies too
    # (each checked its table the same way), and beside the same job without dedup_key.
    assert jobs["eo_xa_events_dedup"]["peer"] in ("structured_streaming_dedup", "spark_anti_join_dedup")
    assert max(jobs[p]["ratio_to_best_peer"] for p in ("structured_streaming_dedup", "spark_anti_join_dedup")) == 1.0
    assert jobs["eo_xa_events_dedup"]["ratio_to_good_records"] > 0
    # events keyed by their id, no transform: the write tasks mark the copies (no marking job, no phase of its own)
    assert {"write", "commit"} <= set(jobs["eo_xa_events_dedup"]["phases"])
    assert "dedup_mark" not in jobs["eo_xa_events_dedup"]["phases"]
    assert jobs["eo_kafka_txn"]["peer"] == "spark_kafka_writer"
    # PostgreSQL: both sinks against Spark's JDBC append into PostgreSQL, the limit with COPY's rate.
    assert {jobs[n]["peer"] for n in ("eo_pg_upsert", "eo_pg_two_phase")} == {"spark_jdbc_append_pg"}
    assert jobs["spark_jdbc_append_pg"]["ratio_to_best_peer"] == 1.0
    assert jobs["r_db_pg"]["note"] == "fastest: copy_from_stdin"
    assert jobs["spark_kafka_writer"]["ratio_to_best_peer"] == jobs["spark_jdbc_append_counts"]["ratio_to_best_peer"] \
        == 1.0
    # Dead letters: by the executors (no driver phase) and through the driver, each next to the good records' rate.
    assert "dead_letters" not in jobs["eo_xa_dead_letters"]["phases"]
    assert "dead_letters" in jobs["eo_xa_dead_letters_via_driver"]["phases"]
    assert all(jobs[n]["ratio_to_good_records"] > 0 for n in ("eo_xa_dead_letters", "eo_xa_dead_letters_via_driver"))
    assert {"plan", "commit", "finalize", "write"} <= set(jobs["eo_xa_events"]["phases"])
    assert 0 < jobs["eo_upsert"]["protocol_share"] < 1
    # Debezium change events (3,000 of 300 keys) applied to MySQL and PostgreSQL by us and by Structured Streaming's
    # foreachBatch with a staging table: each job compared its table with the source's last state, row for row.
    for name, peer in (("eo_cdc_upsert", "structured_streaming_cdc"),
                       ("eo_cdc_upsert_pg", "structured_streaming_cdc_pg")):
        for job in (name, peer):
            assert jobs[job]["note"].startswith("table = the source's last state ("), jobs[job]
        assert jobs[name]["peer"] == peer and jobs[peer]["ratio_to_best_peer"] == 1.0
        assert {"changes", "p_parse", "p_newest", "p_lookup"} <= set(jobs[name]["phases"])
        assert "change_positions" not in jobs[name]["phases"]  # the write tasks recorded the positions
        assert {"stage", "merge"} == set(jobs[peer]["phases"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "x best peer" in done.stdout and "of limit" in done.stdout
