"""Recover a pipeline's in-doubt batch behind a human approval (Airflow 3.1+ human-in-the-loop).

``airflow eo recover`` does on a shell what this DAG does in the UI: its approval task (an ``ApprovalOperator``, in
Airflow's "Required actions") runs the recovery as a dry run, shows it, waits for a person to read it and answer,
and on "Approve" applies it, recorded in the pipeline's audit log with the approver as the actor
(``airflow:<user>``) and the run's ``reason``. "Reject" changes nothing.

The approval binds the plan the approver read: the dry run's plan (each in-doubt branch's and unfinished batch's
action) waits with the task (its parked ``kwargs``, kept by Airflow, not an XCom) and is applied only while recovery
would do exactly that, else refused, changing nothing (a batch a healthy attempt planned or prepared since the dry
run is nobody's to abort); trigger the DAG again for a fresh dry run.
Who answered and what they chose are the response Airflow hands the resumed approval task (not an XCom); the person
who triggered the run cannot approve it unless the Airflow Variable ``eo_recovery_allow_self_approval`` is
``true``; the Variable ``eo_recovery_approvers`` (JSON: ``[{"id": "...", "name": "..."}]``) names who may answer.
Applied in the approval task itself: a cleared task asks again, one approval applies one plan once. The applied
report is the task's return value.

Trigger it with a pipeline id and a reason (Trigger DAG → conf).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import DAG, Param, Variable
from airflow.sdk.exceptions import AirflowFailException, TaskAwaitingInput, TaskDeferred


def operations(actor: str) -> Any:
    from airflow_eo.hooks.operations import pipeline_operations

    return pipeline_operations(actor=actor)


def as_code(text: str) -> str:
    """``text`` as a Markdown code block that nothing in it can close (a fence longer than its backticks)."""
    longest = max((len(part) for part in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


class RecoveryApproval(ApprovalOperator):
    """The recovery's dry run shown for approval, and applied once approved (in this task: clearing it runs the dry
    run again and asks again).

    The plan the approver reads travels with the waiting task itself (the ``kwargs`` it parks with, which Airflow
    keeps in the task instance's ``next_kwargs`` and hands back on resume), never through an XCom that a user who
    can write XComs could change between the question and the answer."""

    def execute(self, context: Any) -> Any:
        from airflow_eo.ops.repairs import recovery_plan

        params = context["params"]
        report = operations("airflow:dry-run").recover(params["pipeline_id"])
        plan = recovery_plan(report)
        self.body = (f"Recovery of pipeline `{params['pipeline_id']}`, as a dry run: nothing has changed yet. "
                     f"Reason given:\n\n{as_code(params['reason'])}\n\n"
                     f"```json\n{json.dumps(report.to_dict(), indent=2, default=str)}\n```")
        approvers = json.loads(Variable.get("eo_recovery_approvers", default="null") or "null")
        if approvers:
            self.assigned_users = approvers
        try:
            return super().execute(context)
        except TaskAwaitingInput as parked:  # Airflow 3.3+: waits with no trigger
            raise TaskAwaitingInput(method_name=parked.method_name, timeout=parked.timeout,
                                    kwargs={**(parked.kwargs or {}), "approved_plan": plan}) from None
        except TaskDeferred as deferred:  # Airflow 3.1-3.2: waits in the triggerer
            raise TaskDeferred(trigger=deferred.trigger, method_name=deferred.method_name, timeout=deferred.timeout,
                               kwargs={**(deferred.kwargs or {}), "approved_plan": plan}) from None

    def execute_complete(self, context: Any, event: dict[str, Any],
                         approved_plan: dict[str, Any] | None = None) -> Any:
        from airflow_eo.core.approval import APPROVE, approval_refusal

        answer = super().execute_complete(context, event)
        if answer["chosen_options"] != [APPROVE]:
            return answer  # rejected: nothing to apply
        if approved_plan is None:
            raise AirflowFailException("not applied: this approval carries no plan (asked by another version of this "
                                       "DAG?); clear the task to run the dry run again and ask again")
        # ``event`` is the response as the API server recorded it (its human-in-the-loop record, handed to this
        # resumed task by Airflow), not an XCom: no task or user writes it.
        responder = event.get("responded_by_user") or {}
        who = {"id": responder.get("id"), "name": responder.get("name")} if responder else None
        allow_self = Variable.get("eo_recovery_allow_self_approval", default="false").strip().lower() == "true"
        refusal = approval_refusal(event.get("chosen_options"), who, context["dag_run"].triggering_user_name,
                                   allow_self_approval=allow_self)
        if refusal is not None:
            raise AirflowFailException(f"not applied: {refusal}")
        params = context["params"]
        assert who is not None
        return operations(f"airflow:{who['name'] or who['id']}").recover(
            params["pipeline_id"], apply=True, reason=params["reason"], approved_plan=approved_plan).to_dict()


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
) as dag:

    RecoveryApproval(
        task_id="approve",
        subject="Apply the recovery of pipeline {{ params.pipeline_id }}?",
        response_timeout=timedelta(hours=8),
    )
