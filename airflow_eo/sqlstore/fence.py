"""The epoch fence: the row holding a pipeline's fencing epoch, locked and checked by every fenced write."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from airflow_eo.core.errors import FencedError
from airflow_eo.core.identifiers import validate_identifier
from airflow_eo.core.planning import Interval
from airflow_eo.sqlstore.dialect import StoreDialect


@dataclass(frozen=True)
class EpochFence:
    """The row that holds a pipeline's fencing epoch (in interval mode: the interval's), and the
    check that an attempt's epoch still holds it.

    The store's own writes lock it ``FOR UPDATE``. An upsert sink on the same server reads it
    with a shared lock at the start of each of its transactions (``LOCK IN SHARE MODE``, ``FOR SHARE``): a take
    (``epoch += 1``) then waits for the writes in flight, and every later write of an older
    attempt, such as a zombie executor's, aborts. Picklable: it travels to the executors.

    :param database: qualifies the table (a database or a schema, as the store's database names it), for a
        connection whose default is another.
    :param dialect: the store's database.
    """

    pipeline_id: str
    epoch: int
    interval: Interval | None = None
    database: str | None = None
    dialect: StoreDialect = field(kw_only=True)

    def query(self, lock: str) -> tuple[str, tuple[Any, ...]]:
        prefix = self.dialect.qualifier(validate_identifier(self.database, "database name") if self.database else None)
        if self.interval is None:
            return (f"SELECT epoch FROM {prefix}eo_pipeline WHERE pipeline_id = %s {lock}", (self.pipeline_id,))
        return (f"SELECT epoch FROM {prefix}eo_interval WHERE pipeline_id = %s AND interval_start = %s "
                f"AND interval_end = %s {lock}", (self.pipeline_id, *utc_bounds(self.interval)))

    def check(self, cur: Any, lock: Literal["update", "share", "none"] = "update") -> None:
        """Read the epoch row (locked ``FOR UPDATE``, with a ``share`` lock against writers only, or not locked);
        FencedError unless it holds ours."""
        locks = {"update": self.dialect.exclusive_lock, "share": self.dialect.share_lock, "none": ""}
        cur.execute(*self.query(locks[lock]))
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

