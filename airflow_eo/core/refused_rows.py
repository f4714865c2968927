"""Rows a sink's table refuses only when they are written: a ``CHECK`` or foreign-key constraint, a trigger that
raises, a unique index other than the key, a value beyond a ``DECIMAL``'s or a date column's range, an ``"add"``
that overflows. Unlike what :mod:`airflow_eo.core.value_checks` decides from the catalog before the write, these are
known only from the database's error, which names no record.

When a batch's write fails on one, the failed write's rows are written again by the same partition writers in
transactions that are always rolled back (probes): slices of a task's rows first, then halves of each slice that
fails, down to the single rows the table refuses; then, in the rows left, each row the table refuses only after an
earlier one (two records of one value of a unique index: the later is refused). Those records become bad records
(dead letters, or the batch fails naming the first), and the batch is written again without them. The probes change
nothing that anyone can see, so exactly-once is untouched: what commits is still the one write the protocol
commits.

Two records of one value of a unique index in two write tasks of a two-phase sink meet no error at all: the later
task's insert waits on the earlier task's prepared branch, which keeps its locks until the batch commits, which waits
for the later task. So a two-phase write task waits at most :data:`ROW_LOCK_WAIT_S` for a row lock; past that its
failure is marked (:data:`LOCK_WAIT_MARK`), the batch's branches are rolled back and the batch is written again in
one task, where the second record of the value is refused at once and is found as above (probes in one task too).
When the one task waits out a lock as well, the lock is another transaction's, not the batch's: the batch fails, to
be retried.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Marks a write task's failure on a value the table refuses, so the driver can tell it from any other failure in
#: the text of the Spark job's error (the only thing that crosses from a task to the driver).
REFUSED_MARK = "[airflow_eo: the table refused a row]"
#: Marks a two-phase write task that waited :data:`ROW_LOCK_WAIT_S` for a row lock (the module's docstring).
LOCK_WAIT_MARK = "[airflow_eo: a write task waited on a row lock]"
#: Seconds a write task of a two-phase sink waits for another transaction's row lock (InnoDB's default is 50 s;
#: PostgreSQL waits without end). Another application's row lock lasts milliseconds in an OLTP table; past this the
#: cost is small: the batch is written again in one task, and fails for a retry only if that task waits too.
ROW_LOCK_WAIT_S = 10
#: Rows of the first probes of a task: the task's rows in slices of this many.
PROBE_ROWS = 4096
#: Refused rows one task isolates one by one; past that, the rows of each slice the table still refuses are refused
#: as one set (a producer sending thousands of refused records would otherwise hold the batch for hours of probes, a
#: dozen per row).
MAX_REFUSED_PER_TASK = 500
#: Times a batch is written again without the rows found: a second write can still meet a row refused (a value of
#: a unique index that another write task of the batch wrote, say).
REFUSAL_ROUNDS = 3

Probe = Callable[[Sequence[int]], "str | None"]


@dataclass(frozen=True)
class RefusedRow:
    """One row of a task's rows (its index in the task's order) and the database's error for it."""

    index: int
    error: str


def isolate_refused(count: int, probe: Probe, *, first_slice: int = PROBE_ROWS,
                    limit: int = MAX_REFUSED_PER_TASK) -> tuple[list[RefusedRow], bool]:
    """The rows (of ``count``, in index order) that the table refuses, and whether the search went past ``limit``:
    ``probe(rows)`` writes the rows of those indexes (in that order) in a transaction it rolls back and returns the
    database's error when the table refused one (None when it took them all).

    First the rows refused alone: slices that fail are halved until single rows are left. Then the rows refused only
    together with earlier ones (two records of one value of a unique index): while the rows left fail, the shortest
    prefix of them that fails is found by halving, and its last row is refused, as the database would refuse the
    later of two inserts; the earlier row is written. Past ``limit`` rows found, each slice that still fails is
    refused whole (and, of the rows left, every row from the first refused after an earlier one on): a set that
    holds every refused row, and may hold rows the table would take."""
    refused: list[RefusedRow] = []
    pending = [(lo, min(lo + first_slice, count)) for lo in range(0, count, first_slice)][::-1]
    while pending:
        lo, hi = pending.pop()  # the lowest first: the rows come out in index order
        error = probe(range(lo, hi))
        if error is None:
            continue
        if len(refused) >= limit:
            refused += _a_set(range(lo, hi), error, limit)
        elif hi - lo == 1:
            refused.append(RefusedRow(lo, error))
        else:
            mid = (lo + hi) // 2
            pending += [(mid, hi), (lo, mid)]
    refused += _refused_with_earlier_rows(count, refused, probe, limit)
    return sorted(refused, key=lambda row: row.index), len(refused) > limit


def _refused_with_earlier_rows(count: int, alone: list[RefusedRow], probe: Probe, limit: int) -> list[RefusedRow]:
    """The rows the table refuses only after earlier rows (see :func:`isolate_refused`): one probe of the rows left
    when there are none, about log2(rows) probes of a prefix for each one found. A prefix of rows the table took is
    taken again (a subset of rows a table takes is taken), so each search starts past the last row refused."""
    skipped = {row.index for row in alone}
    left = [i for i in range(count) if i not in skipped]
    found: list[RefusedRow] = []
    passing = 0  # a prefix of ``left`` this long is taken
    error = probe(left) if left else None
    while error is not None:
        lo, hi = max(passing, 1), len(left)  # left[:lo] is taken (one row alone is), left[:hi] is refused
        while hi - lo > 1:
            mid = (lo + hi) // 2
            refusal = probe(left[:mid])
            if refusal is None:
                lo = mid
            else:
                hi, error = mid, refusal
        if len(alone) + len(found) >= limit:
            return found + _a_set(left[hi - 1:], f"{error} (with an earlier record of the batch)", limit)
        found.append(RefusedRow(left.pop(hi - 1), f"{error} (with an earlier record of the batch)"))
        passing = hi - 1
        error = probe(left)
    return found


def _a_set(rows: Sequence[int], error: str, limit: int) -> list[RefusedRow]:
    why = (f"{error}; refused with the {len(rows) - 1} other record(s) of its slice, not searched one by one: more "
           f"than {limit} records of this write task refused")
    return [RefusedRow(i, why) for i in rows]


_AT_ROW = re.compile(r" at row \d+")


def refusal_text(message: str) -> str:
    """A database's error about one row, without the statement's row number (the probe's, which means nothing to a
    reader of the dead letter)."""
    return _AT_ROW.sub("", message).strip()
