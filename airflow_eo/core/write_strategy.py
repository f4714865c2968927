"""How the engine runs a batch's write: the decision, as a plain function over plain facts.

A bad record must fail its batch (``on_bad_record="fail"``) before any of the batch's rows can be seen. Finding the
bad records in the pass that writes (one Spark job reads, parses and writes) costs less than a first pass that
counts them and a second that reads again and writes, and it is safe when the bad records can ride along to the
partition writers (no transform in between; with a transform, the write job counts the parsed records on its way)
and finding one after the write still commits nothing: the sink's writes stay invisible until the commit point, or
bad records are not fatal (dead letters), or the writers hold their partitions until every task has counted its bad
records (a barrier stage: the vote), or the sink commits only after a write job whose every task succeeded (a table
format's commit), and the task that meets a bad record fails.

The engine (``spark/engine.py``, ``SparkBatchEngine.execute``) asks :func:`choose_write_strategy` and carries out
the answer. The facts that cost something (asking Spark about its slots, building the output DataFrame for the sink)
are callables, called only when the decision needs them. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum


class WriteStrategy(str, Enum):
    """How a batch is read, checked for bad records and written."""

    #: one pass: the partition writers get every parsed record, write the good ones and count the bad ones
    ONE_PASS = "one_pass"
    #: one pass, the writers holding their partitions (a barrier stage) and writing only when no task counted a bad
    #: record: for a sink whose writes are visible before the commit point
    VOTE = "vote"
    #: one pass with a transform in between: the write job counts the parsed records on its way (observed metrics)
    ONE_PASS_TRANSFORMED = "one_pass_transformed"
    #: one pass for a sink that commits only after its write job ran whole (a table format's commit, made by the sink's
    #: write): a bad record fails the task that reads it, so the job fails and nothing is committed; the job counts the
    #: records on its way (observed metrics)
    FAIL_IN_TASKS = "fail_in_tasks"
    #: two passes: count the bad records first (a bad record fails the batch before anything is written), then read
    #: again, transform and write
    TWO_PASS = "two_pass"


def choose_write_strategy(*, writes_visible_before_commit: bool, dead_letters: bool, transform: bool,
                          barrier_possible: Callable[[], bool],
                          can_hold_writes: Callable[[], bool],
                          commits_only_after_write_job: bool) -> WriteStrategy:
    """The strategy of a batch's write.

    :param writes_visible_before_commit: the sink's ``writes_visible_before_commit``: readers see what its write
        wrote before the commit point (the upsert sinks).
    :param dead_letters: bad records are dead-lettered (``on_bad_record="dead_letter"``), not fatal.
    :param transform: the pipeline transforms the parsed records before the write.
    :param barrier_possible: whether the engine can run every writer task at once (a barrier stage); called only
        when the vote is the one way left to one pass (no transform, writes visible, bad records fatal).
    :param can_hold_writes: whether the sink's partition writers can hold a whole partition until the vote (the
        sink's ``can_hold_writes`` of the output); called only after ``barrier_possible`` said yes.
    :param commits_only_after_write_job: the sink's ``commits_only_after_write_job``: its commit (made by its write)
        follows the Spark job that writes the output, and only when every task of it succeeded. Without a transform,
        a task that fails on a bad record then commits nothing. (With one, the transform's own filters may be
        evaluated before the check and skip a bad record: the two passes stay.)
    """
    one_pass = not writes_visible_before_commit or dead_letters
    if transform:
        return WriteStrategy.ONE_PASS_TRANSFORMED if one_pass else WriteStrategy.TWO_PASS
    if one_pass:
        return WriteStrategy.ONE_PASS
    if commits_only_after_write_job:
        return WriteStrategy.FAIL_IN_TASKS
    if barrier_possible() and can_hold_writes():
        return WriteStrategy.VOTE
    return WriteStrategy.TWO_PASS
