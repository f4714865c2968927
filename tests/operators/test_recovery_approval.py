"""dags/recover_with_approval.py's approval binds the plan the approver read: the dry run runs in the approval task,
and its plan waits with the task (the parked ``kwargs`` Airflow keeps in ``next_kwargs``), not in an XCom any user
who writes XComs could change between the question and the answer. The ops are an in-memory stand-in of
``PipelineOperations``; the real flow (scheduler, REST approval, a real XA recovery) is
tests/scheduler/test_backfills.py's."""

from __future__ import annotations

import importlib.util
import uuid
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskAwaitingInput

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "recover_with_approval.py"
PLAN = {"branches": [["eo:abc:0/1:0:5:0", "commit"]], "batches": []}


class Report:
    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": "page_views_xa", "dry_run": True, "branches": [{"xid": PLAN["branches"][0][0],
                                                                               "action": "commit"}]}


class Ops:
    """What the DAG calls of ``PipelineOperations``: ``recover``, recorded."""

    def __init__(self, actor: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.actor, self.calls = actor, calls

    def recover(self, pipeline_id: str, **kwargs: Any) -> Any:
        self.calls.append((self.actor, {"pipeline_id": pipeline_id, **kwargs}))
        return Report() if not kwargs.get("apply") else SimpleNamespace(to_dict=lambda: {"applied": True})


@pytest.fixture
def dag_module(monkeypatch) -> tuple[ModuleType, list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    spec = importlib.util.spec_from_file_location("recover_with_approval_under_test", DAG_FILE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls: list[tuple[str, dict[str, Any]]] = []
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(module, "operations", lambda actor: Ops(actor, calls))
    monkeypatch.setattr(module, "Variable", SimpleNamespace(get=lambda key, default=None: default))
    monkeypatch.setattr("airflow_eo.ops.repairs.recovery_plan", lambda report: PLAN)
    monkeypatch.setattr("airflow.providers.standard.operators.hitl.upsert_hitl_detail",
                        lambda **request: asked.append(request))
    return module, calls, asked


def context() -> dict[str, Any]:
    return {"params": {"pipeline_id": "page_views_xa", "reason": "crash after the commit point"},
            "task_instance": SimpleNamespace(id=uuid.uuid4()), "dag_run": SimpleNamespace(triggering_user_name="ann")}


def answer(option: str = "Approve", who: str = "bob") -> dict[str, Any]:
    return {"chosen_options": [option], "params_input": {}, "responded_at": datetime.now(timezone.utc),
            "responded_by_user": {"id": who, "name": who}}


def test_the_plan_shown_waits_with_the_task_and_is_the_one_applied(dag_module):
    module, calls, asked = dag_module
    task = module.dag.get_task("approve")
    with pytest.raises(TaskAwaitingInput) as parked:
        task.execute(context())
    assert parked.value.kwargs == {"approved_plan": PLAN}  # kept by Airflow with the waiting task, handed back
    assert calls == [("airflow:dry-run", {"pipeline_id": "page_views_xa"})]  # the dry run ran in this task
    [request] = asked
    assert "as a dry run" in request["body"] and PLAN["branches"][0][0] in request["body"]
    assert "```text\ncrash after the commit point\n```" in request["body"]
    assert [t.task_id for t in module.dag.tasks] == ["approve"]  # no XCom from another task feeds the approval

    result = task.execute_complete(context(), answer(), **parked.value.kwargs)
    assert result == {"applied": True}
    assert calls[-1] == ("airflow:bob", {"pipeline_id": "page_views_xa", "apply": True,
                                         "reason": "crash after the commit point", "approved_plan": PLAN})


def test_an_answer_without_a_bound_plan_or_from_the_requester_applies_nothing(dag_module):
    module, calls, _ = dag_module
    task = module.dag.get_task("approve")
    with pytest.raises(AirflowFailException, match="carries no plan"):
        task.execute_complete(context(), answer())
    with pytest.raises(AirflowFailException, match="ann asked for this recovery and cannot approve it"):
        task.execute_complete(context(), answer(who="ann"), approved_plan=PLAN)
    assert not [c for c in calls if c[1].get("apply")]
