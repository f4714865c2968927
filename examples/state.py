"""Put the example pipelines back to their first run: forget their progress, empty their outputs.

Used by the tests and the scripts. Forgetting a pipeline deletes its rows from the offset store's tables
(MySQL/MariaDB store): not something airflow_eo offers its users, whose pipelines restart with ``airflow eo rewind``.
"""

from __future__ import annotations

import time
from typing import Any

import pymysql

from airflow_eo.core.xid import pipeline_key
from airflow_eo.kafka.offsets import retry_transient
from airflow_eo.kafka.sink import group_id
from airflow_eo.mysql.database import DATABASE as MYSQL
from airflow_eo.mysql.xa import XaFacade
from airflow_eo.sqlstore.store import SqlOffsetStore
from examples import ip_counts, page_views


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
    for pipeline in pipelines:
        forget_pipeline(connect_kwargs, pipeline)


def forget_pipeline(connect_kwargs: dict[str, Any], pipeline_id: str) -> None:
    """Delete everything the offset store knows of a pipeline: its next run starts as a new pipeline.

    Not fenced: a running attempt of the pipeline fails at its next store write. The sink's rows and any
    prepared XA branches are the caller's to clear.
    """
    SqlOffsetStore(MYSQL, connect_kwargs).migrate()  # the tables exist, at the current version
    conn = pymysql.connect(**connect_kwargs, autocommit=False)
    try:
        with conn.cursor() as cur:
            for table in ("eo_offset", "eo_batch", "eo_interval", "eo_audit", "eo_pipeline"):
                cur.execute(f"DELETE FROM {table} WHERE pipeline_id = %s", (pipeline_id,))
        conn.commit()
    finally:
        conn.close()


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
    forget_pipeline(connect_kwargs, pipeline_id)


def sink_state(mysql_kwargs: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """(``app_pv`` per app, every ``page_view_events`` id): what the page-views examples wrote."""
    conn = pymysql.connect(**mysql_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT app_id, pv FROM app_pv")
            pv = {app: int(n) for app, n in cur.fetchall()}
            cur.execute("SELECT event_id FROM page_view_events")
            ids = [r[0] for r in cur.fetchall()]
        return pv, ids
    finally:
        conn.close()


def our_prepared_branches(mysql_kwargs: dict[str, Any], pipeline: str) -> list[str]:
    """The XA branches the pipeline left prepared on the server."""
    conn = pymysql.connect(**mysql_kwargs, autocommit=True)
    try:
        return [x.encode() for x in XaFacade(conn).recover() if x.pipeline_key == pipeline_key(pipeline)]
    finally:
        conn.close()


def reset_page_views_pg(connect_kwargs: dict[str, Any], pipeline_id: str = "page_views_pg",
                        table: str = "app_pv") -> None:
    """The ``page_views_pg`` pipeline (or ``page_view_events_pg``, ``table="page_view_events"``) back to its first
    run, all on PostgreSQL: its prepared transactions rolled back, its rows in the offset store forgotten, its table
    emptied."""
    import psycopg

    if table not in page_views.POSTGRES_TABLES_DDL:  # a name of ours goes into the TRUNCATE, nothing else
        raise ValueError(f"not an example table: {table!r}")
    from airflow_eo.postgres.database import DATABASE as POSTGRES
    from airflow_eo.postgres.prepared import prepared_session

    page_views.ensure_postgres_tables(connect_kwargs)
    SqlOffsetStore(POSTGRES, connect_kwargs).migrate()
    with prepared_session(connect_kwargs) as prepared:
        for xid in prepared.recover(pipeline_id):
            prepared.rollback(xid)
    with psycopg.connect(**connect_kwargs) as conn:  # one transaction
        for store_table in ("eo_offset", "eo_batch", "eo_interval", "eo_audit", "eo_pipeline"):
            conn.execute(f"DELETE FROM {store_table} WHERE pipeline_id = %s", (pipeline_id,))
        conn.execute(f"TRUNCATE TABLE {table}")


def pg_app_pv(connect_kwargs: dict[str, Any]) -> dict[str, int]:
    """``app_pv`` per app on PostgreSQL: what ``page_views_pg`` wrote."""
    import psycopg

    with psycopg.connect(**connect_kwargs, autocommit=True) as conn:
        return {app: int(n) for app, n in conn.execute("SELECT app_id, pv FROM app_pv").fetchall()}


def pg_prepared_transactions(connect_kwargs: dict[str, Any], pipeline_id: str) -> list[str]:
    """The gids of the pipeline's prepared transactions on a PostgreSQL database."""
    from airflow_eo.postgres.prepared import prepared_session

    with prepared_session(connect_kwargs) as prepared:
        return [x.encode() for x in prepared.recover(pipeline_id)]
