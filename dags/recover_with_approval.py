"""Recover a pipeline's in-doubt batch behind a human approval (Airflow 3.1+ human-in-the-loop).

``airflow eo recover`` does on a shell what this DAG does in the UI: its first task runs the recovery as a dry
run and shows it; the approval task (``ApprovalOperator``, in Airflow's "Required actions") waits for a person
to read it and answer; on "Approve" the last task applies it, recorded in the pipeline's audit log with the
approver as the actor (``airflow:<user>``) and the run's ``reason``. "Reject" skips it. The approval binds the plan
the approver read: ``apply`` gets the dry run's plan (each in-doubt branch's and unfinished batch's action) and
refuses, changing nothing, when recovery would now do anything else (a batch a healthy attempt planned or
prepared since the dry run is nobody's to abort); run the DAG again for a fresh dry run. The applied report is
the task's return value.

Trigger it with a pipeline id and a reason (Trigger DAG → conf).
"""

from __future__ import annotations

import json
import re
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

    def as_code(text: str) -> str:
        """``text`` as a Markdown code block that nothing in it can close (a fence longer than its backticks)."""
        longest = max((len(part) for part in re.findall(r"`+", text)), default=0)
        fence = "`" * max(3, longest + 1)
        return f"{fence}text\n{text}\n{fence}"

    @task
    def dry_run(params: Any = None) -> dict[str, Any]:  # Airflow passes the run's params
        """What the recovery would do: as the approval shows it (Markdown, ``body``) and as ``apply`` checks it
        (``plan``)."""
        from airflow_eo.ops.service import recovery_plan

        report = operations("airflow:dry-run").recover(params["pipeline_id"])
        body = (f"Recovery of pipeline `{params['pipeline_id']}`, as a dry run: nothing has changed yet. "
                f"Reason given:\n\n{as_code(params['reason'])}\n\n"
                f"```json\n{json.dumps(report.to_dict(), indent=2, default=str)}\n```")
        return {"body": body, "plan": recovery_plan(report)}

    approve = ApprovalOperator(
        task_id="approve",
        subject="Apply the recovery of pipeline {{ params.pipeline_id }}?",
        body="{{ ti.xcom_pull(task_ids='dry_run')['body'] }}",
        response_timeout=timedelta(hours=8),
    )

    @task
    def apply(params: Any = None, ti: Any = None) -> dict[str, Any]:
        """The recovery the approver approved (the dry run's plan), applied as the approver; refused if it changed."""
        answer = ti.xcom_pull(task_ids="approve")
        approver = (answer.get("responded_by_user") or {}).get("name") or "unknown"
        approved = ti.xcom_pull(task_ids="dry_run")["plan"]
        return operations(f"airflow:{approver}").recover(params["pipeline_id"], apply=True, reason=params["reason"],
                                                          approved_plan=approved).to_dict()

    dry_run() >> approve >> apply()
