"""Tables of the table formats (Delta Lake, Apache Iceberg) as the tests see them: a sink for a table in a test's
folder, and the table read back with delta-rs and pyiceberg (nothing shared with Spark): its rows, its last commit,
the batches its commits name, and what ``airflow eo status`` says of it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyiceberg.table import StaticTable
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import ancestors_of

#: The table formats, by the name the parametrised tests use.
TABLE_FORMATS = ("delta", "iceberg")


@dataclass(frozen=True)
class FormatTable:
    """A table of ``kind`` (``delta`` or ``iceberg``, a Hadoop catalog's) named ``name`` under ``folder``."""

    kind: str
    folder: Path
    name: str
    options: dict[str, Any]

    @property
    def location(self) -> Path:
        return self.folder / self.name if self.kind == "delta" else self.folder / "lake" / "db" / self.name

    @property
    def label(self) -> str:
        """How the sink names the table in what it says."""
        return f"Delta table {self.location}" if self.kind == "delta" else f"Iceberg table lake.db.{self.name}"

    @property
    def sink(self) -> dict[str, Any]:
        """The job's sink (``tests.support.operator_harness.run_job``): its kind's name and options."""
        if self.kind == "delta":
            return {"kind": "DeltaTableSink", "path": str(self.location), **self.options}
        return {"kind": "IcebergTableSink", "table": f"lake.db.{self.name}", "warehouse": str(self.folder / "lake"),
                **self.options}

    def exists(self) -> bool:
        return (self.location / ("_delta_log" if self.kind == "delta" else "metadata/version-hint.text")).exists()

    def rows(self) -> list[dict[str, Any]]:
        if not self.exists():
            return []
        if self.kind == "delta":
            return DeltaTable(str(self.location)).to_pyarrow_table().to_pylist()
        return StaticTable.from_metadata(str(self.location)).scan().to_arrow().to_pylist()

    def last_commit(self) -> int:
        """The table's current version (Delta) or snapshot id (Iceberg)."""
        if self.kind == "delta":
            return DeltaTable(str(self.location)).version()
        snapshot = StaticTable.from_metadata(str(self.location)).metadata.current_snapshot_id
        assert snapshot is not None, "the table has no snapshot"
        return snapshot

    def batches(self, pipeline: str) -> dict[int, list[list[Any]]]:
        """The offset ranges each of ``pipeline``'s batches in the table's history names, by batch id."""
        if self.kind == "iceberg":
            return {batch: json.loads(summary["airflow-eo.ranges"])
                    for batch, summary in batch_snapshots(self.location, pipeline).items()}
        found: dict[int, list[list[Any]]] = {}
        for entry in DeltaTable(str(self.location)).history():
            meta = json.loads(entry["userMetadata"]) if entry.get("userMetadata") else {}
            if meta.get("airflow_eo.pipeline") == pipeline:
                assert meta["airflow_eo.batch"] not in found, "a batch committed two versions"
                found[meta["airflow_eo.batch"]] = meta["airflow_eo.ranges"]
        return found

    def status_note(self, batch_id: int) -> str:
        """What ``airflow eo status`` says of the table when ``batch_id`` is its last commit."""
        commit = "version" if self.kind == "delta" else "snapshot"
        last = self.last_commit()
        return (f"{self.label}: {commit} {last}; this pipeline's last batch in it: batch {batch_id} at "
                f"{commit} {last}")


def format_table(kind: str, folder: Path, name: str, **options: Any) -> FormatTable:
    """A table of ``kind`` for a test: ``options`` are the sink's (``key_columns``, ``updates``, ..)."""
    if kind not in TABLE_FORMATS:
        raise ValueError(f"no table format {kind!r}: one of {TABLE_FORMATS}")
    return FormatTable(kind, folder, name, options)


def batch_snapshots(table: Path | TableMetadata, pipeline: str | None = None) -> dict[int, dict[str, str]]:
    """The summary of each snapshot in the table's history (the current snapshot's ancestry: a staged snapshot
    never published is not the table's) that names an airflow_eo batch, by batch id (pyiceberg, not Spark). A
    snapshot that cherry-picked a staged one names it (``source-snapshot-id``): the batch's summary is the
    staged one's. ``table``: a Hadoop catalog's table folder, or a table's metadata; ``pipeline``: only its batches."""
    metadata = StaticTable.from_metadata(str(table)).metadata if isinstance(table, Path) else table
    found = {}
    for snapshot in ancestors_of(metadata.current_snapshot(), metadata):
        summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        if "source-snapshot-id" in summary:
            source = metadata.snapshot_by_id(int(summary["source-snapshot-id"]))
            summary = dict(source.summary.additional_properties) if source and source.summary else summary
        if "airflow-eo.batch" in summary and summary["airflow-eo.pipeline"] == (pipeline or
                                                                                summary["airflow-eo.pipeline"]):
            assert int(summary["airflow-eo.batch"]) not in found, "a batch committed two snapshots"
            found[int(summary["airflow-eo.batch"])] = summary
    return found
