"""The store's part of ``airflow eo prune``: bounded reads of the candidates and bounded deletes.

A mixin of :class:`~airflow_eo.sqlstore.store.SqlOffsetStore` (its ``transaction()``, ``migrate()`` and
``dialect``). One SQL text for MariaDB and PostgreSQL. Every DELETE names at most one chunk of rows by key and is
its own transaction, so a big prune never holds many row locks for long; and every DELETE checks again, in SQL, what
the decision (:mod:`airflow_eo.core.history`) checked: the row is committed or aborted, below the bound, last
written before the cutoff. A batch that changed meanwhile (it cannot: it is below the last committed one) stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import UNFINISHED, BatchState
from airflow_eo.core.history import PRUNABLE_STATES
from airflow_eo.sqlstore.dialect import StoreDialect
from airflow_eo.sqlstore.rows import batch_record, utc


def _naive_utc(at: datetime) -> datetime:
    """A UTC value as the drivers bind it (naive): the session reads and compares timestamps in UTC."""
    return at if at.tzinfo is None else at.astimezone(timezone.utc).replace(tzinfo=None)


class StoreHistory:
    """Prune the batch log and the audit log."""

    dialect: StoreDialect

    def transaction(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def migrate(self) -> None:
        raise NotImplementedError

    def prune_facts(self, pipeline_id: str) -> tuple[int | None, int | None]:
        """The pipeline's newest committed batch id and its oldest unfinished one (None: none), by its index."""
        self.migrate()
        with self.transaction() as cur:
            cur.execute("SELECT MAX(batch_id) AS b FROM eo_batch WHERE pipeline_id = %s AND state = %s",
                        (pipeline_id, BatchState.COMMITTED.value))
            last = cur.fetchone()
            cur.execute("SELECT MIN(batch_id) AS b FROM eo_batch WHERE pipeline_id = %s AND state IN (%s, %s)",
                        (pipeline_id, *[s.value for s in UNFINISHED]))
            oldest = cur.fetchone()
        return (None if last is None or last["b"] is None else int(last["b"]),
                None if oldest is None or oldest["b"] is None else int(oldest["b"]))

    def prune_candidates(self, pipeline_id: str, after: int, below: int, cutoff: datetime,
                         limit: int) -> list[tuple[BatchRecord, datetime | None]]:
        """Up to ``limit`` committed or aborted batches with ``after < batch_id < below`` last written before
        ``cutoff`` (UTC), in batch order, with when each was last written. By the primary key's range."""
        with self.transaction() as cur:
            cur.execute(self.dialect.utc_session)
            cur.execute("SELECT * FROM eo_batch WHERE pipeline_id = %s AND batch_id > %s AND batch_id < %s "
                        "AND state IN (%s, %s) AND updated_at < %s ORDER BY batch_id "
                        + self.dialect.limit.format(n="%s"),
                        (pipeline_id, after, below, *[s.value for s in PRUNABLE_STATES], _naive_utc(cutoff), limit))
            return [(batch_record(r), utc(r["updated_at"])) for r in cur.fetchall()]

    def delete_batches(self, pipeline_id: str, batch_ids: Sequence[int], below: int, cutoff: datetime) -> int:
        """Delete these batches (one statement, one transaction), each only if still committed or aborted, below
        ``below`` and last written before ``cutoff``; how many went."""
        if not batch_ids:
            return 0
        with self.transaction() as cur:
            cur.execute(self.dialect.utc_session)
            cur.execute(f"DELETE FROM eo_batch WHERE pipeline_id = %s AND batch_id IN "
                        f"({', '.join(['%s'] * len(batch_ids))}) AND batch_id < %s AND state IN (%s, %s) "
                        "AND updated_at < %s",
                        (pipeline_id, *batch_ids, below, *[s.value for s in PRUNABLE_STATES], _naive_utc(cutoff)))
            return int(cur.rowcount)

    def oldest_batch_time(self, pipeline_id: str, from_batch: int) -> datetime | None:
        """When the pipeline's oldest batch row from ``from_batch`` on was created (UTC)."""
        with self.transaction() as cur:
            cur.execute(self.dialect.utc_session)
            cur.execute("SELECT created_at FROM eo_batch WHERE pipeline_id = %s AND batch_id >= %s ORDER BY batch_id "
                        + self.dialect.limit.format(n="1"), (pipeline_id, from_batch))
            row = cur.fetchone()
            return None if row is None else utc(row["created_at"])

    def audit_candidates(self, pipeline_id: str, before: datetime, after_id: int, limit: int) -> list[int]:
        """Up to ``limit`` audit ids of the pipeline above ``after_id`` written before ``before`` (UTC), oldest
        first. By the (pipeline_id, audit_id) index."""
        with self.transaction() as cur:
            cur.execute(self.dialect.utc_session)
            cur.execute("SELECT audit_id FROM eo_audit WHERE pipeline_id = %s AND audit_id > %s AND created_at < %s "
                        "ORDER BY audit_id " + self.dialect.limit.format(n="%s"),
                        (pipeline_id, after_id, _naive_utc(before), limit))
            return [int(r["audit_id"]) for r in cur.fetchall()]

    def delete_audit(self, pipeline_id: str, audit_ids: Sequence[int], before: datetime) -> int:
        """Delete these audit rows (one statement, one transaction), each only if written before ``before``."""
        if not audit_ids:
            return 0
        with self.transaction() as cur:
            cur.execute(self.dialect.utc_session)
            cur.execute(f"DELETE FROM eo_audit WHERE pipeline_id = %s AND audit_id IN "
                        f"({', '.join(['%s'] * len(audit_ids))}) AND created_at < %s",
                        (pipeline_id, *audit_ids, _naive_utc(before)))
            return int(cur.rowcount)
