"""The benchmark's jobs by name: the limits, the peers (at least once) and ours (exactly once), and the peers
each job is compared with."""

from __future__ import annotations

from bench import cdc, dedup

EVENTS_PEERS = ("structured_streaming_foreach_batch", "spark_jdbc_append", "airflow_consume_from_topic")
PG_PEERS = ("spark_jdbc_append_pg",)
#: The Delta Lake table's peers: a Spark batch append of the parsed events, Structured Streaming into Delta's own sink.
DELTA_PEERS = ("spark_delta_append", "structured_streaming_delta")
DELTA_OURS = ("eo_delta_append", "eo_delta_merge")
DELTA_JOBS = (*DELTA_PEERS, *DELTA_OURS)
#: The Iceberg table's peers, the same two ways into a table of a Hadoop catalog on the local disk.
ICEBERG_PEERS = ("spark_iceberg_append", "structured_streaming_iceberg")
ICEBERG_OURS = ("eo_iceberg_append", "eo_iceberg_merge")
ICEBERG_JOBS = (*ICEBERG_PEERS, *ICEBERG_OURS)
PEERS = (*EVENTS_PEERS, "spark_jdbc_append_counts", "spark_kafka_writer", *PG_PEERS, *DELTA_PEERS, *ICEBERG_PEERS,
         *cdc.PEERS, *dedup.PEERS)
DEAD_LETTERS = ("eo_xa_dead_letters", "eo_xa_dead_letters_via_driver")
PG_OURS = ("eo_pg_upsert", "eo_pg_two_phase")
OURS = ("eo_upsert", "eo_xa_events", "eo_xa_events_avro", "eo_xa_events_dedup", "eo_xa_counts", "eo_kafka_txn",
        *DEAD_LETTERS, *PG_OURS, *DELTA_OURS, *ICEBERG_OURS, *cdc.OURS)
#: The peers each job is compared with (a peer with its own kind, too): the same input and output shape. Dead letters
#: are a row per record into a table, as the events are.
PEERS_OF = {
    **{name: EVENTS_PEERS for name in (*EVENTS_PEERS, "eo_upsert", "eo_xa_events", *DEAD_LETTERS)},
    "spark_jdbc_append_counts": ("spark_jdbc_append_counts",), "eo_xa_counts": ("spark_jdbc_append_counts",),
    "spark_kafka_writer": ("spark_kafka_writer",), "eo_kafka_txn": ("spark_kafka_writer",),
    # The same pipeline and events, the values Confluent-framed Avro instead of JSON: the format's cost.
    "eo_xa_events_avro": ("eo_xa_events",),
    # dedup_key on a topic where a tenth of the records re-send an event, against the tools that drop copies too (the
    # ratio to the same job without dedup_key, eo_xa_events, is printed beside it: the check's cost).
    **{name: dedup.PEERS for name in (*dedup.PEERS, "eo_xa_events_dedup")},
    # PostgreSQL: the same events into a table of the same shape on PostgreSQL.
    **{name: PG_PEERS for name in (*PG_PEERS, *PG_OURS)},
    # Delta Lake: the same parsed events into a fresh table at a local path (the MERGE against the appends too: what
    # people run today is an append).
    **{name: DELTA_PEERS for name in DELTA_JOBS},
    **{name: ICEBERG_PEERS for name in ICEBERG_JOBS},
    # Debezium change events applied to a table, against Structured Streaming's foreachBatch into the same database.
    **cdc.PEERS_OF,
}
LIMITS = ("r_kafka", "r_db", "r_db_pg")
EMPTY_BATCH = "eo_empty_batch"  # seconds, not records/s: no ratio, no limit, not in the chart
EVENTS_SHAPE = ("structured_streaming_foreach_batch", "spark_jdbc_append", "airflow_consume_from_topic",
                "eo_upsert", "eo_xa_events", "eo_xa_events_avro", "eo_xa_events_dedup", *dedup.PEERS)
#: Jobs also compared with ``eo_xa_events`` (the same events into the same table): what their extra work costs.
COMPARED_WITH_PLAIN = (*DEAD_LETTERS, "eo_xa_events_dedup")
PG_EVENTS_SHAPE = (*PG_PEERS, *PG_OURS)
