"""The approval binds the plan: ``recover(..., approved_plan=...)`` (what dags/recover_with_approval.py's ``apply``
runs with the dry run's plan) applies the recovery only while it is the one the approver read."""

from __future__ import annotations

import uuid

import pytest

from airflow_eo.core.batch import Owner
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.errors import OperationError
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.ops.repairs import recovery_plan
from airflow_eo.sinks import MySqlUpsertSink


def test_an_approved_recovery_is_refused_when_a_healthy_attempt_planned_a_batch_since(airflow_db):
    pipeline, owner = f"approved_{uuid.uuid4().hex[:8]}", Owner("eo_dag", "eo_task")
    sink = MySqlUpsertSink(table=f"ap_{uuid.uuid4().hex[:8]}", key_columns=["event_id"]).record()
    ops = pipeline_operations(actor="approver@test")
    store = ops.store
    epoch = store.take_pipeline(pipeline, owner=owner, sink=sink)
    stuck = store.insert_batch(pipeline, epoch, "run-1", [OffsetRange("t", 0, 0, 10)], [])
    approved = recovery_plan(ops.recover(pipeline))  # the dry run the approver reads
    assert approved == {"branches": [], "batches": [[stuck.batch_id, epoch, "run-1", "abort"]]}

    # Hours later, before the answer: a healthy attempt recovered batch 1 itself and planned the next one.
    healthy = store.take_pipeline(pipeline, owner=owner, sink=sink)
    store.abort_batch(stuck, healthy)
    running = store.insert_batch(pipeline, healthy, "run-2", [OffsetRange("t", 0, 0, 10)], [])
    with pytest.raises(OperationError, match="the recovery changed since the dry run that was approved"):
        ops.recover(pipeline, apply=True, reason="approved", approved_plan=approved)
    assert store.pipeline(pipeline).epoch == healthy, "the running attempt is not fenced"
    assert store.get_batch(pipeline, running.batch_id).state == BatchState.PLANNED, "nor its batch aborted"
    assert ops.history(pipeline).audit == [], "nothing was audited: nothing was done"

    # A dry run of now, approved, is applied.
    again = recovery_plan(ops.recover(pipeline))
    done = ops.recover(pipeline, apply=True, reason="approved again", approved_plan=again)
    assert not done.dry_run and store.get_batch(pipeline, running.batch_id).state == BatchState.ABORTED
