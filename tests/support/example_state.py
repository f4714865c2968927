"""Put the example pipelines back to their first run: forget their progress, empty their outputs.

Used by the tests and ``scripts/demo.py``; a pipeline's progress is forgotten through the
store's own :meth:`~airflow_eo.mysql.store.MySqlOffsetStore.forget_pipeline`.
"""

from __future__ import annotations

import time
from typing import Any

import pymysql

from airflow_eo.core.xid import pipeline_key
from airflow_eo.examples import ip_counts, page_views
from airflow_eo.kafka.offsets import retry_transient
from airflow_eo.kafka.sink import group_id
from airflow_eo.mysql.store import MySqlOffsetStore
from airflow_eo.mysql.xa import XaFacade


def forget_pipelines(connect_kwargs: dict[str, Any], *pipelines: str) -> None:
    """Roll back the pipelines' prepared XA branches and forget them in the offset store."""
    conn = pymysql.connect(**connect_kwargs, autocommit=True)
    try:
        keys = {pipeline_key(p) for p in pipelines}
        xa = XaFacade(conn)
        for xid in xa.recover():
            if xid.pipeline_key in keys:
                xa.rollback(xid)
    finally:
        conn.close()
    store = MySqlOffsetStore(connect_kwargs)
    for pipeline in pipelines:
        store.forget_pipeline(pipeline)


def reset_page_views(connect_kwargs: dict[str, Any], *pipelines: str) -> None:
    """Forget the pipelines and empty the example tables: the next run starts from the earliest offset."""
    page_views.ensure_tables(connect_kwargs)
    forget_pipelines(connect_kwargs, *pipelines)
    conn = pymysql.connect(**connect_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            for table in page_views.TABLES_DDL:
                cur.execute(f"TRUNCATE TABLE {table}")
    finally:
        conn.close()


def reset_ip_counts(bootstrap: str, connect_kwargs: dict[str, Any], pipeline_id: str = "ip_counts_kafka") -> None:
    """Empty both topics (delete their records), forget the pipeline's group offsets and store rows."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    leadership_not_ready = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART}
    ip_counts.ensure_topics(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in (ip_counts.SOURCE, ip_counts.SINK):
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        for attempt in range(20):
            # OFFSET_END (-1) deletes everything up to the high watermark.
            futures = admin.delete_records([TopicPartition(topic, p, -1) for p in partitions]).values()
            try:
                for future in futures:
                    future.result()
                break
            except KafkaException as exc:  # a just-created topic's leaders may not be in place yet
                if attempt == 19 or exc.args[0].code() not in leadership_not_ready:
                    raise
                time.sleep(0.5)

    def delete_group() -> None:
        for future in admin.delete_consumer_groups([group_id(pipeline_id)], request_timeout=30).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:  # the group may not exist yet
                    raise

    # A fresh broker answers NOT_COORDINATOR while its __consumer_offsets partitions are being created.
    retry_transient("deleting the pipeline's consumer group", delete_group, timeout_s=60)
    MySqlOffsetStore(connect_kwargs).forget_pipeline(pipeline_id)
