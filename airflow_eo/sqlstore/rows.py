"""The offset store's rows as the core's records (and the audit row's insert), shared by the store's modules."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from airflow_eo.core.batch import BatchRecord, BatchSummary, Owner
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.pipeline_status import BatchInfo
from airflow_eo.core.planning import Interval
from airflow_eo.core.ranges import ranges_from_json


def insert_audit(cur: Any, pipeline_id: str, epoch: int | None, actor: str, action: str, reason: str | None,
                  details: dict[str, Any]) -> None:
    cur.execute("INSERT INTO eo_audit (pipeline_id, actor, action, reason, epoch, details) "
                "VALUES (%s, %s, %s, %s, %s, %s)", (pipeline_id, actor, action, reason, epoch, json.dumps(details)))


def row_owner(row: dict[str, Any]) -> Owner | None:
    """The owner of an ``eo_pipeline`` row; None when it has none, or only the text of an earlier store version."""
    if row["owner_dag_id"] is None or row["owner_task_id"] is None:
        return None
    return Owner(row["owner_dag_id"], row["owner_task_id"])


def utc(value: datetime | None) -> datetime | None:
    """A TIMESTAMP read in a UTC session, as an aware datetime."""
    return None if value is None else value.replace(tzinfo=timezone.utc)


def batch_info(row: dict[str, Any]) -> BatchInfo:
    return BatchInfo(batch_record(row), utc(row["created_at"]), utc(row["updated_at"]), utc(row["committed_at"]))


def batch_record(row: dict[str, Any]) -> BatchRecord:
    return BatchRecord(
        pipeline_id=row["pipeline_id"],
        batch_id=int(row["batch_id"]),
        run_id=row["run_id"],
        epoch=int(row["epoch"]),
        state=BatchState(row["state"]),
        ranges=ranges_from_json(row["ranges"]),
        skipped=ranges_from_json(row["skipped"]),
        xids=json.loads(row["xids"]) if row["xids"] else [],
        summary=BatchSummary.from_dict(json.loads(row["summary"])) if row["summary"] else None,
        interval=(Interval(row["interval_start"].replace(tzinfo=timezone.utc),
                           row["interval_end"].replace(tzinfo=timezone.utc))
                  if row["interval_start"] is not None else None),
    )
