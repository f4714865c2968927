"""``airflow eo verify`` on the ``page_views_xa`` example DAG's real runs (``dag.test()`` in a child), each drift made
for real on the same pipeline: healthy (exit 0), its consumer group moved back by hand with the Admin API, a run
marked success by hand in Airflow's metadata database without a batch, and a run SIGKILLed right after its commit
point (failpoint ``after_commit_point``: its XA branches stay prepared). Two DAG runs and three ``airflow eo`` children
in all; the drift between them is read in this process through the same ``PipelineOperations.verify``."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from airflow_eo.hooks.operations import pipeline_operations
from airflow_eo.kafka.offsets import group_id
from examples.page_views import TOPIC, produce_page_views
from examples.state import our_prepared_branches
from tests.support.children import why
from tests.support.cli import eo
from tests.support.page_views import XA_PIPELINE, committed_offsets, reset, run_dag

DAG_ID, TASK_ID = "page_views_xa", "count_page_views"


def forget_runs(dag_id: str) -> None:
    """Airflow forgets the DAG's runs (earlier tests ran it on a store that was reset since)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(TaskInstance).where(TaskInstance.dag_id == dag_id))
        session.execute(delete(DagRun).where(DagRun.dag_id == dag_id))


def mark_success_by_hand(dag_id: str, task_id: str) -> str:
    """A new run of the DAG whose task is marked success as the UI's "Mark as success" does, nothing run."""
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    run_id = f"manual__by_hand_{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc)
    with create_session() as session:
        dag = DBDagBag().get_latest_version_of_dag(dag_id, session=session)
        assert dag is not None
        dag.create_dagrun(run_id=run_id, logical_date=now, data_interval=(now, now), run_after=now,
                          run_type=DagRunType.MANUAL, triggered_by=DagRunTriggeredByType.TEST,
                          state=DagRunState.RUNNING, session=session)
    with create_session() as session:
        dag.set_task_instance_state(task_id=task_id, run_id=run_id, state=TaskInstanceState.SUCCESS, session=session)
    return run_id


def move_group(bootstrap: str, pipeline: str, partition: int, offset: int) -> None:
    """An operator's hand on the group: ``alter_consumer_group_offsets`` (``kafka-consumer-groups --reset-offsets``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(group_id(pipeline), [TopicPartition(TOPIC, partition, offset)])]
    for future in admin.alter_consumer_group_offsets(request, request_timeout=30).values():
        future.result(timeout=60)


def findings(report: dict) -> dict[tuple[str, str], str]:
    return {(f["check"], f["subject"]): f["message"] for f in report["findings"]}


def test_verify_finds_nothing_on_a_healthy_pipeline_then_each_drift_made_for_real(bootstrap, mysql_kwargs,
                                                                                     airflow_db, capsys):
    reset(mysql_kwargs, XA_PIPELINE)
    forget_runs(DAG_ID)
    produce_page_views(bootstrap, 300)
    done = run_dag(DAG_ID)
    assert done.returncode == 0, why(done)

    healthy = eo("verify", XA_PIPELINE)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "finding" not in healthy.stderr and "not checked" not in healthy.stdout
    for check in ("tiling: 1 committed batches", f"mirror: group {group_id(XA_PIPELINE)}, 3 partitions",
                  "in-doubt: prepared branches on MySqlXaSink's server", f"runs: 1 runs of {DAG_ID}.{TASK_ID}"):
        assert f"checked: {check}" in healthy.stdout
    with capsys.disabled():
        print(f"\n$ airflow eo verify {XA_PIPELINE}\n{healthy.stdout}")

    ops = pipeline_operations(actor="tester@here")
    store = committed_offsets(mysql_kwargs, XA_PIPELINE)
    assert store[0] > 0
    move_group(bootstrap, XA_PIPELINE, 0, 0)
    moved = findings(ops.verify(XA_PIPELINE).to_dict())
    assert list(moved) == [("mirror", f"{TOPIC}[0]")]
    assert f"has 0, the store {store[0]}: lag tools show a lag too high by {store[0]}" in moved[
        ("mirror", f"{TOPIC}[0]")]

    by_hand = mark_success_by_hand(DAG_ID, TASK_ID)
    marked = findings(ops.verify(XA_PIPELINE).to_dict())
    assert set(marked) == {("mirror", f"{TOPIC}[0]"), ("runs", f"run {by_hand}")}
    assert "the task succeeded in Airflow but the store has no batch of it" in marked[("runs", f"run {by_hand}")]

    produce_page_views(bootstrap, 100)
    killed = run_dag(DAG_ID, fault="after_commit_point")  # SIGKILL right after the store's commit point
    assert killed.returncode == -9, why(killed)
    prepared = our_prepared_branches(mysql_kwargs, XA_PIPELINE)
    assert prepared
    drifted = eo("verify", XA_PIPELINE, "-o", "json")
    assert drifted.returncode == 1 and "finding(s) for pipeline page_views_xa" in drifted.stderr
    report = json.loads(drifted.stdout)
    found = findings(report)
    assert {subject for check, subject in found if check == "in-doubt"} == {f"branch {x}" for x in prepared}
    assert all("passed its commit point and recorded this branch" in found[("in-doubt", f"branch {x}")]
               for x in prepared)
    assert ("runs", f"run {by_hand}") in found
    # The killed run never mirrored its batch: the group is behind on every partition the batch moved.
    after = committed_offsets(mysql_kwargs, XA_PIPELINE)
    assert {s for c, s in found if c == "mirror"} == {f"{TOPIC}[{p}]" for p in after if after[p] != store[p]} | {
        f"{TOPIC}[0]"}
    assert not [s for c, s in found if c == "tiling"] and report["unchecked"] == []
    human = eo("verify", XA_PIPELINE)
    assert human.returncode == 1 and human.stdout.count("\n") >= len(found)
    assert all(f"{check}: {subject}: " in human.stdout for check, subject in found)
    with capsys.disabled():
        print(f"\n$ airflow eo verify {XA_PIPELINE}\n{human.stdout}{human.stderr}")

    # Recovery commits the branches (the output now shows the batch): that finding is gone, the others are not.
    ops.recover(XA_PIPELINE, apply=True, reason="in doubt after a SIGKILL")
    assert our_prepared_branches(mysql_kwargs, XA_PIPELINE) == []
    left = findings(ops.verify(XA_PIPELINE).to_dict())
    assert not [s for c, s in left if c == "in-doubt"] and ("runs", f"run {by_hand}") in left
