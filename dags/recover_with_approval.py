"""Recover a pipeline's in-doubt batch behind a human approval (Airflow 3.1+ human-in-the-loop).

``airflow eo recover`` does on a shell what this DAG does in the UI: its first task runs the recovery as a dry
run and shows it; the approval task (``ApprovalOperator``, in Airflow's "Required actions") waits for a person
to read it and answer; on "Approve" the last task applies it, recorded in the pipeline's audit log with the
approver as the actor (``airflow:<user>``) and the run's ``reason``. "Reject" skips it. The recovery applied is
the one the pipeline's next attempt would run (deterministic: committed batches' branches are committed, all
others rolled back), so what changed between the dry run and the approval cannot make it wrong; the applied
report is the task's return value.

Trigger it with a pipeline id and a reason (Trigger DAG → conf).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG, Param, task


def operations(actor: str) -> Any:
    from airflow_eo.hooks.operations import pipeline_operations

    return pipeline_operations(actor=actor)


with DAG(
    dag_id="eo_recover_with_approval",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["airflow_eo", "example", "operations"],
    doc_md=__doc__,
    params={
        "pipeline_id": Param("page_views_xa", type="string", description="the pipeline to recover"),
        "reason": Param("", type="string", minLength=1, description="why (recorded in the audit log)"),
    },
):

    @task
    def dry_run(params: Any = None) -> str:  # Airflow passes the run's params
        """What the recovery would do, as the approval shows it (Markdown)."""
        report = operations("airflow:dry-run").recover(params["pipeline_id"]).to_dict()
        return (f"Recovery of pipeline `{params['pipeline_id']}` (reason: {params['reason']}), as a dry run: "
                f"nothing has changed yet.\n\n```json\n{json.dumps(report, indent=2, default=str)}\n```")

    approve = ApprovalOperator(
        task_id="approve",
        subject="Apply the recovery of pipeline {{ params.pipeline_id }}?",
        body="{{ ti.xcom_pull(task_ids='dry_run') }}",
        response_timeout=timedelta(hours=8),
    )

    @task
    def apply(params: Any = None, ti: Any = None) -> dict[str, Any]:
        """The recovery, applied as the approver."""
        answer = ti.xcom_pull(task_ids="approve")
        approver = (answer.get("responded_by_user") or {}).get("name") or "unknown"
        return operations(f"airflow:{approver}").recover(params["pipeline_id"], apply=True,
                                                          reason=params["reason"]).to_dict()

    dry_run() >> approve >> apply()
