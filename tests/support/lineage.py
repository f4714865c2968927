"""OpenLineage events of real runs, as Airflow's OpenLineage provider sends them through its file transport: the
environment that turns the transport on in a ``dag.test()`` child, and the checks every sink kind's COMPLETE event
must pass (the topics in, the sink out in the spec's naming, our batch facet, the rows written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def file_transport(path: Path) -> dict[str, str]:
    """The environment of a child whose OpenLineage events are appended to ``path``, one JSON event per line.

    A task's events are sent from a thread, not from a fork of the child (the provider's default): the child runs a
    Spark driver, and a fork of a process with threads running can inherit a lock held by one of them and wait on
    it for good (Python 3.12 warns of exactly this). Its DAG runs' events go through a process pool, which
    ``scripts/run_dag.py`` starts from a fork server for the same reason."""
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(path),
                                                         "append": True}),
            "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True"}


def completes(path: Path, job: str) -> list[dict[str, Any]]:
    """The COMPLETE events of task ``job`` (``dag_id.task_id``) in the file, in the order they were sent."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [e for e in events if e["eventType"] == "COMPLETE" and e["job"]["name"] == job]


def assert_batch_lineage(event: dict[str, Any], inputs: list[tuple[str, str]], output: tuple[str, str],
                         pipeline: str) -> dict[str, Any]:
    """One committed batch's COMPLETE event: its inputs and output, and its ``airflowEoBatch`` facet agreeing with the
    ``outputStatistics`` rows and with its own offset ranges; returns the facet."""
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == inputs, event["inputs"]
    [out] = event["outputs"]
    assert (out["namespace"], out["name"]) == output, out
    batch = event["run"]["facets"]["airflowEoBatch"]
    assert batch["pipeline"] == pipeline and batch["state"] == "committed", batch
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == batch["rowsOut"]
    assert sum(r["untilOffset"] - r["fromOffset"] for r in batch["ranges"]) == batch["recordsIn"], batch
    return batch
