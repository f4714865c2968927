"""A pipeline's rows of the seen-id table (``dedup_key``), read through its sink's database descriptor."""

from __future__ import annotations

from typing import Any

from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE


def seen_rows(database: Any, connect_kwargs: dict[str, Any], pipeline_id: str) -> list[dict[str, Any]]:
    return database.read_dicts(connect_kwargs, f"SELECT event_id, topic, kafka_partition, kafka_offset, seen_at, "  # type: ignore[no-any-return]
                               f"batch_id FROM {SEEN_ID_TABLE} WHERE pipeline_key = %s",
                               (seen_pipeline_key(pipeline_id),))
