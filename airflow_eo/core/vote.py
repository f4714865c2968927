"""A held write and its vote, side by side (the ``agreed`` of :class:`~airflow_eo.core.batch.PartitionWriter`).

An upsert writer that must hold its partition until every task has counted no bad record could wait for the vote and
then write. Spark's barrier answers no sooner than about a second (its task polls the answer once a second), so the
writer instead writes inside a transaction it has not committed while the vote runs in a thread, then commits if
every task agreed and rolls back if not: nothing is visible before the verdict either way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def write_while_voting(agreed: Callable[[], bool], write: Callable[[], T]) -> tuple[bool, T]:
    """Runs ``agreed`` in a thread while ``write`` runs here; returns (the verdict, what ``write`` returned).

    ``write`` must leave its work uncommitted: the caller commits on True and rolls back on False. When ``write``
    raises, the vote is not waited for (the other tasks may never answer): the task fails, and Spark fails the
    barrier stage with it.
    """
    verdict: list[bool] = []
    failure: list[BaseException] = []

    def vote() -> None:
        try:
            verdict.append(agreed())
        except BaseException as exc:  # re-raised in the task's thread below
            failure.append(exc)

    voter = threading.Thread(target=vote, name="airflow_eo-vote", daemon=True)
    voter.start()
    result = write()
    voter.join()
    if failure:
        raise failure[0]
    return verdict[0], result
