"""The decisions behind ``airflow eo retire`` and ``rename`` (``airflow_eo.core.lifecycle``), as plain code: whether a
run may be going on, when each is refused and why, what a retire removes, what a run of a retired id is told."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import BatchState
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.lifecycle import (
    BatchSeen,
    PipelineRows,
    active_run,
    check_new_pipeline_id,
    rename_refusal,
    retire_plan,
    retire_refusal,
    retired_message,
)
from airflow_eo.core.pipeline_status import PipelineInfo

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
IDLE = 600.0


def info(epoch: int = 5, taken_s_ago: float = 3600, mode: Mode = Mode.CONTINUOUS,
         retired: bool = False) -> PipelineInfo:
    return PipelineInfo("p", epoch, "dag.task", mode, NOW - timedelta(seconds=taken_s_ago),
                        SinkRecord("MySqlXaSink", True, "mysql_default", "t", "eo_dead_letter"),
                        retired_at=NOW if retired else None)


def seen(batch_id: int, state: BatchState, epoch: int, written_s_ago: float) -> BatchSeen:
    return BatchSeen(BatchRecord("p", batch_id, f"run-{batch_id}", epoch, state, []),
                     NOW - timedelta(seconds=written_s_ago))


def test_a_batch_written_lately_is_a_run_going_on_and_one_quiet_for_longer_is_in_doubt():
    planned_now = seen(7, BatchState.PLANNED, 5, written_s_ago=30)
    reason = active_run(info(), [planned_now], [], NOW, IDLE)
    assert reason is not None and "batch 7 is planned, written 30s ago" in reason and "epoch 5" in reason
    prepared_long_ago = seen(7, BatchState.PREPARED, 5, written_s_ago=700)  # a killed run's, or a very long job's
    assert active_run(info(), [prepared_long_ago], [], NOW, IDLE) is None
    assert active_run(info(), [prepared_long_ago], [], NOW, 800) is not None  # --idle-for longer: still running
    # A batch of an earlier epoch written lately is a run's too (interval mode fences per interval).
    assert active_run(info(mode=Mode.INTERVAL), [seen(2, BatchState.PLANNED, 1, 5)], [], NOW, IDLE) is not None


def test_an_epoch_taken_lately_without_a_batch_since_is_a_run_starting_unless_an_operation_took_it():
    finished = seen(6, BatchState.COMMITTED, 4, written_s_ago=3000)
    starting = info(epoch=5, taken_s_ago=20)
    reason = active_run(starting, [finished], [], NOW, IDLE)
    assert reason is not None and "epoch 5 was taken 20s ago" in reason
    assert active_run(starting, [finished], [5], NOW, IDLE) is None  # `recover` took it: nobody's run
    assert active_run(info(epoch=5, taken_s_ago=900), [finished], [], NOW, IDLE) is None  # quiet for long
    # The attempt holding the epoch committed its batch: it is done (publishing at most).
    assert active_run(starting, [seen(7, BatchState.COMMITTED, 5, 10)], [], NOW, IDLE) is None
    assert active_run(info(epoch=5, taken_s_ago=20, mode=Mode.INTERVAL), [], [], NOW, IDLE) is None


def test_retire_is_refused_while_a_run_may_be_going_on_saying_what_to_do():
    assert retire_refusal(info(), None) is None
    refusal = retire_refusal(info(), "batch 7 is planned, written 3s ago")
    assert refusal is not None and "batch 7 is planned" in refusal and "--idle-for" in refusal


def test_rename_is_refused_onto_an_existing_id_while_running_with_work_in_doubt_or_retired():
    assert rename_refusal(info(), "q", False, None, []) is None
    assert "already has a pipeline 'q'" in (rename_refusal(info(), "q", True, None, []) or "")
    assert "the pipeline's id" in (rename_refusal(info(), "p", False, None, []) or "")
    assert "run going on" in (rename_refusal(info(), "q", False, "batch 3 ...", []) or "")
    in_doubt = rename_refusal(info(), "q", False, None, ["batch 3 is prepared (abort)"])
    assert in_doubt is not None and "airflow eo recover p --apply" in in_doubt and "batch 3 is prepared" in in_doubt
    assert "--undo" in (rename_refusal(info(retired=True), "q", False, None, []) or "")
    assert "interval mode" in (rename_refusal(info(mode=Mode.INTERVAL), "q", False, None, []) or "")
    with pytest.raises(ConfigurationError, match="invalid pipeline_id 'a b'"):
        check_new_pipeline_id("a b")


class InMemoryRows:
    """A sink's rows keyed by the pipeline, in memory (the role :class:`PipelineRows`)."""

    def __init__(self) -> None:
        self.tables = {"eo_seen_ids": {"p": 3, "other": 2}, "eo_dead_letter": {"p": 1}}

    def pipeline_rows(self, pipeline_id: str, dead_letters: bool) -> dict[str, int]:
        return {t: rows.get(pipeline_id, 0) for t, rows in self.tables.items()
                if dead_letters or t != "eo_dead_letter"}

    def remove_pipeline_rows(self, pipeline_id: str, dead_letters: bool) -> dict[str, int]:
        counted = self.pipeline_rows(pipeline_id, dead_letters)
        for table in counted:
            self.tables[table].pop(pipeline_id, None)
        return counted

    def move_pipeline_rows(self, old: str, new: str) -> dict[str, int]:
        moved = {}
        for table, rows in self.tables.items():
            moved[table] = rows[new] = rows.pop(old, 0)
        return moved


def test_a_retire_plan_lists_the_group_and_the_sinks_rows_and_keeps_dead_letters_unless_asked():
    rows = InMemoryRows()
    assert isinstance(rows, PipelineRows)
    kept = retire_plan(info(), "airflow_eo.p", True, rows.pipeline_rows("p", False), dead_letters=False)
    assert kept.consumer_group == "airflow_eo.p" and dict(kept.sink_rows) == {"eo_seen_ids": 3}
    assert not kept.dead_letters and any("dead letters are kept" in n for n in kept.notes)
    removed = retire_plan(info(), "airflow_eo.p", True, rows.pipeline_rows("p", True), dead_letters=True)
    assert removed.dead_letters and dict(removed.sink_rows) == {"eo_seen_ids": 3, "eo_dead_letter": 1}
    assert rows.remove_pipeline_rows("p", True) == {"eo_seen_ids": 3, "eo_dead_letter": 1}
    assert rows.tables == {"eo_seen_ids": {"other": 2}, "eo_dead_letter": {}}  # another pipeline's rows stay
    none = retire_plan(info(), None, False, {}, dead_letters=True)
    assert not none.dead_letters and any("keeps no rows" in n for n in none.notes)


def test_a_run_of_a_retired_id_is_told_how_to_bring_it_back():
    message = retired_message("p", NOW)
    assert "'p' was retired (2026-11-28T12:00:00+00:00" in message
    assert "airflow eo retire p --undo --apply --reason TEXT" in message and "another pipeline_id=" in message
