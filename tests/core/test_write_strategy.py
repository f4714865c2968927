"""The write strategy (``airflow_eo.core.write_strategy``): one pass, the vote or two passes, and which facts that cost
something (Spark's slots, the sink's look at the output) are asked for, in which order."""

from __future__ import annotations

import itertools

import pytest

from airflow_eo.core.write_strategy import WriteStrategy, choose_write_strategy


class Facts:
    """The two lazy facts, recording in which order they were asked."""

    def __init__(self, barrier: bool = True, hold: bool = True) -> None:
        self.barrier, self.hold, self.asked = barrier, hold, []

    def barrier_possible(self) -> bool:
        self.asked.append("barrier")
        return self.barrier

    def can_hold_writes(self) -> bool:
        self.asked.append("hold")
        return self.hold


def choose(facts: Facts, *, visible: bool, dead_letters: bool, transform: bool,
           commits_after_job: bool = False) -> WriteStrategy:
    return choose_write_strategy(writes_visible_before_commit=visible, dead_letters=dead_letters, transform=transform,
                                 barrier_possible=facts.barrier_possible, can_hold_writes=facts.can_hold_writes,
                                 commits_only_after_write_job=commits_after_job)


@pytest.mark.parametrize(("visible", "dead_letters"), [(False, False), (False, True), (True, True)],
                         ids=["invisible writes", "invisible writes, dead letters", "visible writes, dead letters"])
def test_without_a_transform_one_pass_when_a_bad_record_found_after_the_write_commits_nothing(visible, dead_letters):
    facts = Facts()
    assert choose(facts, visible=visible, dead_letters=dead_letters, transform=False) is WriteStrategy.ONE_PASS
    assert facts.asked == []  # neither Spark nor the sink is asked


def test_visible_writes_and_fatal_bad_records_vote_when_a_barrier_runs_and_the_sink_holds_its_writes():
    facts = Facts(barrier=True, hold=True)
    assert choose(facts, visible=True, dead_letters=False, transform=False) is WriteStrategy.VOTE
    assert facts.asked == ["barrier", "hold"]


def test_no_barrier_stage_means_two_passes_and_the_sink_is_not_asked():
    facts = Facts(barrier=False, hold=True)
    assert choose(facts, visible=True, dead_letters=False, transform=False) is WriteStrategy.TWO_PASS
    assert facts.asked == ["barrier"]  # the output DataFrame is never built for can_hold_writes


def test_a_sink_that_cannot_hold_its_writes_gets_two_passes():
    facts = Facts(barrier=True, hold=False)
    assert choose(facts, visible=True, dead_letters=False, transform=False) is WriteStrategy.TWO_PASS
    assert facts.asked == ["barrier", "hold"]


@pytest.mark.parametrize(("visible", "dead_letters"), [(False, False), (False, True), (True, True)],
                         ids=["invisible writes", "invisible writes, dead letters", "visible writes, dead letters"])
def test_with_a_transform_one_pass_observed_when_a_bad_record_found_after_the_write_commits_nothing(visible,
                                                                                                  dead_letters):
    facts = Facts()
    assert choose(facts, visible=visible, dead_letters=dead_letters,
                  transform=True) is WriteStrategy.ONE_PASS_TRANSFORMED
    assert facts.asked == []


def test_with_a_transform_visible_writes_and_fatal_bad_records_take_two_passes_without_a_vote():
    facts = Facts(barrier=True, hold=True)  # a vote would be possible: a transform's output is never held
    assert choose(facts, visible=True, dead_letters=False, transform=True) is WriteStrategy.TWO_PASS
    assert facts.asked == []


def test_a_sink_committing_only_after_its_write_job_fails_the_task_that_reads_a_bad_record_in_one_pass():
    facts = Facts(barrier=True, hold=True)
    assert choose(facts, visible=True, dead_letters=False, transform=False,
                  commits_after_job=True) is WriteStrategy.FAIL_IN_TASKS
    assert facts.asked == []  # neither Spark nor the sink is asked


def test_with_a_transform_a_sink_committing_after_its_write_job_takes_two_passes():
    # the transform's own filters may run before the check and skip a bad record the batch must fail on
    facts = Facts()
    assert choose(facts, visible=True, dead_letters=False, transform=True,
                  commits_after_job=True) is WriteStrategy.TWO_PASS


@pytest.mark.parametrize(("visible", "dead_letters", "transform", "barrier", "hold"),
                         list(itertools.product([False, True], repeat=5)))
def test_no_fatal_bad_record_reaches_a_reader_and_the_costly_facts_are_asked_only_when_needed(
        visible, dead_letters, transform, barrier, hold):
    facts = Facts(barrier=barrier, hold=hold)
    strategy = choose(facts, visible=visible, dead_letters=dead_letters, transform=transform)
    fatal_and_visible = visible and not dead_letters
    if fatal_and_visible:  # written before the bad records are known only when the writers hold it until the vote
        assert strategy in (WriteStrategy.VOTE, WriteStrategy.TWO_PASS)
    else:  # never two passes when one is safe
        assert strategy in (WriteStrategy.ONE_PASS, WriteStrategy.ONE_PASS_TRANSFORMED)
    assert (strategy is WriteStrategy.ONE_PASS_TRANSFORMED) == (transform and not fatal_and_visible)
    assert (strategy is WriteStrategy.VOTE) == (fatal_and_visible and not transform and barrier and hold)
    expected_asks = [] if transform or not fatal_and_visible else ["barrier", "hold"] if barrier else ["barrier"]
    assert facts.asked == expected_asks
