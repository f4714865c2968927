"""Rows a sink's table refuses only when they are written: a ``CHECK`` or foreign-key constraint, a trigger that
raises, a unique index other than the key, a value beyond a ``DECIMAL``'s or a date column's range, an ``"add"``
that overflows. Unlike what :mod:`airflow_eo.core.value_checks` decides from the catalog before the write, these are
known only from the database's error, which names no record.

When a batch's write fails on one, the failed write's rows are written again by the same partition writers in
transactions that are always rolled back (probes): slices of a task's rows first, then halves of each slice that
fails, down to the single rows the table refuses. Those records become bad records (dead letters, or the batch
fails naming the first), and the batch is written again without them. The probes change nothing that anyone can
see, so exactly-once is untouched: what commits is still the one write the protocol commits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

#: Marks a write task's failure on a value the table refuses, so the driver can tell it from any other failure in
#: the text of the Spark job's error (the only thing that crosses from a task to the driver).
REFUSED_MARK = "[airflow_eo: the table refused a row]"
#: Rows of the first probes of a task: the task's rows in slices of this many.
PROBE_ROWS = 4096
#: Refused rows one task may isolate; beyond that the batch fails (a table that refuses this many rows of one
#: batch has a problem a dead-letter table does not solve, and each row found costs a dozen probes).
MAX_REFUSED_PER_TASK = 500
#: Times a batch is written again without the rows found: a second write can still meet a row that the table
#: refused only together with another (two rows of one unique value in two slices).
REFUSAL_ROUNDS = 3


@dataclass(frozen=True)
class RefusedRow:
    """One row of a task's rows (its index in the task's order) and the database's error for it alone."""

    index: int
    error: str


class TooManyRefused(Exception):
    """More than ``limit`` rows of one task are refused."""

    def __init__(self, found: list[RefusedRow], limit: int) -> None:
        super().__init__(f"more than {limit} rows of one write task are refused by the table")
        self.found = found


def isolate_refused(count: int, probe: Callable[[int, int], str | None], *, first_slice: int = PROBE_ROWS,
                    limit: int = MAX_REFUSED_PER_TASK) -> list[RefusedRow]:
    """The rows (of ``count``, in index order) that the table refuses alone: ``probe(lo, hi)`` writes rows
    ``lo..hi-1`` in a transaction it rolls back and returns the database's error when the table refused one (None
    when it took them all). Slices that fail are halved until single rows are left; raises :class:`TooManyRefused`
    past ``limit``. A slice that fails while both its halves pass (rows refused only together) yields no row."""
    refused: list[RefusedRow] = []
    pending = [(lo, min(lo + first_slice, count)) for lo in range(0, count, first_slice)][::-1]
    while pending:
        lo, hi = pending.pop()  # the lowest first: the rows come out in index order
        error = probe(lo, hi)
        if error is None:
            continue
        if hi - lo == 1:
            refused.append(RefusedRow(lo, error))
            if len(refused) > limit:
                raise TooManyRefused(refused, limit)
            continue
        mid = (lo + hi) // 2
        pending += [(mid, hi), (lo, mid)]
    return refused


_AT_ROW = re.compile(r" at row \d+")


def refusal_text(message: str) -> str:
    """A database's error about one row, without the statement's row number (the probe's, which means nothing to a
    reader of the dead letter)."""
    return _AT_ROW.sub("", message).strip()
