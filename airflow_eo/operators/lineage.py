"""OpenLineage of a micro-batch: its topics in, its sink out, and where the batch stands, as facets a lineage backend
reads without knowing Airflow's own facet.

Datasets follow OpenLineage's naming (``kafka://host:port`` + topic, ``mysql://host:port`` + ``database.table``,
``postgres://host:port`` + ``database.schema.table``, a Delta or Iceberg table by its location, ``file`` + the path:
the sinks' :meth:`~airflow_eo.core.sink_kinds.SinkSpec.lineage`, ``core/lineage_names.py``); a lakehouse output also
carries the ``storage`` facet (``delta``, ``iceberg``) and an Iceberg table its catalog name as ``symlinks``. The run
carries the facet ``airflowEoBatch`` (:class:`AirflowEoBatchRunFacet`): the pipeline, the batch, its offset ranges
per partition and its counts on COMPLETE; on FAIL, the state the store holds the run's batch in (planned, prepared,
aborted, or none planned) with its ranges. The sink's output carries ``outputStatistics`` (rows written).

Imported only when Airflow's OpenLineage provider asks (apache-airflow-providers-openlineage stays optional).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attr
from airflow.providers.common.compat.openlineage.facet import (
    Dataset,
    OutputStatisticsOutputDatasetFacet,
    RunFacet,
)
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import OutputDataset
from openlineage.client.generated.storage_dataset import StorageDatasetFacet
from openlineage.client.generated.symlinks_dataset import Identifier, SymlinksDatasetFacet

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.lineage_names import LineageDataset

#: The facet's key in a run's facets.
FACET = "airflowEoBatch"


@attr.define
class AirflowEoBatchRunFacet(RunFacet):
    """One micro-batch of an airflow_eo pipeline: which offsets it covers and what became of them.

    :param pipeline: the pipeline id (the offset store's key).
    :param batchId: the batch id (None: no batch was planned by this run).
    :param state: ``committed`` (or ``replayed``, ``already_committed``) on COMPLETE; on FAIL what the store holds:
        ``planned``, ``prepared``, ``aborted``, ``committed`` or ``not_planned``.
    :param ranges: ``{"topic", "partition", "fromOffset", "untilOffset"}`` per partition (until exclusive).
    :param duplicates: records dropped as copies of events already seen (``dedup_key``).
    """

    # camelCase, as OpenLineage spells its fields
    pipeline: str
    batchId: int | None
    state: str
    ranges: list[dict[str, Any]] = attr.field(factory=list)
    recordsIn: int | None = None
    rowsOut: int | None = None
    deadLetters: int | None = None
    duplicates: int | None = None
    runId: str | None = None
    interval: dict[str, str] | None = None

    @staticmethod
    def _get_schema() -> str:
        # No public schema of ours to point at: the base RunFacet's (backends read the fields by name).
        return "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunFacet"


def _ranges(ranges: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"topic": r["topic"], "partition": r["partition"], "fromOffset": r["from_offset"],
             "untilOffset": r["until_offset"]} for r in ranges]


def _dataset_facets(sink: LineageDataset) -> dict[str, Any]:
    facets: dict[str, Any] = {}
    if sink.symlinks:
        facets["symlinks"] = SymlinksDatasetFacet(identifiers=[Identifier(namespace=s.namespace, name=s.name,
                                                                          type=s.type) for s in sink.symlinks])
    if sink.storage_layer:
        facets["storage"] = StorageDatasetFacet(storageLayer=sink.storage_layer, fileFormat="parquet")
    return facets


def completed(kafka_namespace: str, topics: Sequence[str], sink: LineageDataset,
              summary: Mapping[str, Any]) -> OperatorLineage:
    """COMPLETE: the batch's facet from its summary (the task's XCom), the rows written on the output."""
    state = ("already_committed" if summary.get("already_committed")
             else "replayed" if summary.get("replayed") else "committed")
    facet = AirflowEoBatchRunFacet(
        pipeline=summary["pipeline_id"], batchId=summary["batch_id"], state=state, ranges=_ranges(summary["ranges"]),
        recordsIn=summary["records_in"], rowsOut=summary["rows_out"], deadLetters=summary["dead_letters"],
        duplicates=summary.get("duplicates"), runId=summary["run_id"], interval=summary.get("interval"))
    rows = None if summary.get("already_committed") else summary["rows_out"]
    output = OutputDataset(namespace=sink.namespace, name=sink.name, facets=_dataset_facets(sink),
                           outputFacets={"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=rows)})
    return OperatorLineage(inputs=[Dataset(namespace=kafka_namespace, name=t) for t in topics], outputs=[output],
                           run_facets={FACET: facet})


def failed(kafka_namespace: str, topics: Sequence[str], sink: LineageDataset, pipeline_id: str,
           run_id: str, batch: BatchRecord | None) -> OperatorLineage:
    """FAIL: where the store holds the run's batch (``batch``: None when none was planned)."""
    facet = AirflowEoBatchRunFacet(
        pipeline=pipeline_id, batchId=None if batch is None else batch.batch_id,
        state="not_planned" if batch is None else batch.state.value,
        ranges=[] if batch is None else _ranges([{"topic": r.topic, "partition": r.partition,
                                                   "from_offset": r.from_offset, "until_offset": r.until_offset}
                                                  for r in batch.ranges]),
        runId=run_id)
    return OperatorLineage(inputs=[Dataset(namespace=kafka_namespace, name=t) for t in topics],
                           outputs=[Dataset(namespace=sink.namespace, name=sink.name, facets=_dataset_facets(sink))],
                           run_facets={FACET: facet})
