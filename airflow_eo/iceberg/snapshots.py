"""What an Iceberg snapshot says of an airflow_eo batch: the summary properties a batch's snapshot carries, the
write-audit-publish id of a batch, and the table's metadata read on the driver with pyiceberg (no Spark)."""

from __future__ import annotations

import json
from typing import Any

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.recovery import TableTransaction, table_claim

#: the snapshot summary properties of a batch (``<table>.snapshots``' ``summary`` column shows them)
PIPELINE, BATCH, APP_ID, INTERVAL, RANGES = (f"airflow-eo.{k}" for k in ("pipeline", "batch", "app-id", "interval",
                                                                         "ranges"))
#: a staged write's own token: which of the batch's staged snapshots (a zombie's, a crashed attempt's) is this one
STAGE = "airflow-eo.stage"

def wap_id(txn: TableTransaction) -> str:
    """The batch's write-audit-publish id: the same for every attempt of the batch (``<app id>@<batch id>``)."""
    return f"{txn.app_id}@{txn.version}"


def batch_summary(snapshot: Any, metadata: Any) -> dict[str, str]:
    """The ``airflow-eo.*`` summary of the batch a snapshot of the table's history committed (empty: none).

    A cherry-picked append is a new snapshot whose summary has Iceberg's ``source-snapshot-id`` (the staged one,
    which carries ours) and ``published-wap-id``; once the staged snapshot is expired, the wap id still names the
    app id and the batch."""
    summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
    if BATCH in summary or "source-snapshot-id" not in summary:
        return summary
    source_id = table_claim(summary["source-snapshot-id"])  # Iceberg's, but any writer may set a summary property
    source = None if source_id is None else metadata.snapshot_by_id(source_id)
    if source is not None and source.summary and BATCH in source.summary.additional_properties:
        return dict(source.summary.additional_properties)
    app_id, _, batch = summary.get("published-wap-id", "").rpartition("@")
    return {APP_ID: app_id, BATCH: batch} if app_id.startswith("airflow_eo.") and batch.isdigit() else summary


def latest_metadata_file(location: str) -> str:
    """The table's newest ``metadata/v<N>.metadata.json``: ``version-hint.text`` is written after each commit, as
    a hint (a slower committer may write an older one last), so the next versions are looked for as Iceberg's own
    Hadoop table operations do. Raises FileNotFoundError without a table."""
    from pyiceberg.io import load_file_io

    io = load_file_io(location=location)
    folder = f"{location.rstrip('/')}/metadata"
    with io.new_input(f"{folder}/version-hint.text").open() as hint:
        version = int(hint.read().decode().strip())
    while io.new_input(f"{folder}/v{version + 1}.metadata.json").exists():
        version += 1
    return f"{folder}/v{version}.metadata.json"


def ancestor_ids(metadata: Any) -> set[int]:
    from pyiceberg.table.snapshots import ancestors_of

    return {s.snapshot_id for s in ancestors_of(metadata.current_snapshot(), metadata)}


def snapshot_properties(batch: BatchContext, txn: TableTransaction) -> dict[str, str]:
    """What a snapshot's summary says of its batch: pipeline, batch, app id, interval and the offset ranges (JSON
    ``[[topic, partition, from, until], ...]``)."""
    properties = {PIPELINE: batch.pipeline_id, BATCH: str(batch.batch_id), APP_ID: txn.app_id,
                  RANGES: json.dumps([[r.topic, r.partition, r.from_offset, r.until_offset]
                                      for r in sorted(batch.ranges)])}
    if batch.interval is not None:
        properties[INTERVAL] = f"{batch.interval.start.isoformat()}/{batch.interval.end.isoformat()}"
    return properties
