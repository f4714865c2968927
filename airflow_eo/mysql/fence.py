"""The epoch fence: the row holding a pipeline's fencing epoch, locked and checked by every fenced write."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_eo.core.errors import FencedError
from airflow_eo.core.identifiers import quote_identifier
from airflow_eo.core.planning import Interval


@dataclass(frozen=True)
class EpochFence:
    """The row that holds a pipeline's fencing epoch (in interval mode: the interval's), and the
    check that an attempt's epoch still holds it.

    The store's own writes lock it ``FOR UPDATE``. An upsert sink on the same server reads it
    with a shared lock at the start of each of its transactions (``LOCK IN SHARE MODE``): a take
    (``epoch += 1``) then waits for the writes in flight, and every later write of an older
    attempt, such as a zombie executor's, aborts. Picklable: it travels to the executors.

    :param database: qualifies the table, for a connection whose default database is another.
    """

    pipeline_id: str
    epoch: int
    interval: Interval | None = None
    database: str | None = None

    def query(self, lock: str) -> tuple[str, tuple[Any, ...]]:
        prefix = f"{quote_identifier(self.database, 'database name')}." if self.database else ""
        if self.interval is None:
            return (f"SELECT epoch FROM {prefix}eo_pipeline WHERE pipeline_id = %s {lock}", (self.pipeline_id,))
        return (f"SELECT epoch FROM {prefix}eo_interval WHERE pipeline_id = %s AND interval_start = %s "
                f"AND interval_end = %s {lock}", (self.pipeline_id, *utc_bounds(self.interval)))

    def check(self, cur: Any, lock: str) -> None:
        """Lock the epoch row (``lock``: ``FOR UPDATE`` or ``LOCK IN SHARE MODE``); FencedError unless it holds ours."""
        cur.execute(*self.query(lock))
        row = cur.fetchone()
        current = None if row is None else (row["epoch"] if isinstance(row, dict) else row[0])
        if current != self.epoch:
            holder = f"pipeline {self.pipeline_id!r}" + (f" interval {self.interval}" if self.interval else "")
            taker = "took the pipeline" if self.interval is None else "of the same interval took it"
            raise FencedError(
                f"{holder}: this attempt holds epoch {self.epoch} but a newer attempt {taker} "
                f"(epoch {current}); this attempt stops without committing"
            )



def utc_bounds(interval: Interval) -> tuple[datetime, datetime]:
    """Naive UTC datetimes for DATETIME columns (no session time-zone involved)."""
    return interval.start.replace(tzinfo=None), interval.end.replace(tzinfo=None)

