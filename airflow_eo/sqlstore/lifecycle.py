"""The store's part of ``airflow eo retire`` and ``rename``: one transaction each, under the pipeline row's lock.

A mixin of :class:`~airflow_eo.sqlstore.store.SqlOffsetStore` (its ``transaction()``, ``migrate()`` and ``dialect``).
Each write checks, under the lock every fenced write of an attempt takes too, that nobody took the pipeline since the
operation looked (its epoch) and that no batch is unfinished; takes the epoch (fencing any attempt still alive); and
appends its audit row. The decisions are :mod:`airflow_eo.core.lifecycle`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from airflow_eo.core.batch_states import UNFINISHED
from airflow_eo.core.errors import OperationError, UnknownPipelineError
from airflow_eo.core.lifecycle import RENAME_ACTION, RETIRE_ACTION, UNRETIRE_ACTION
from airflow_eo.sqlstore.dialect import StoreDialect
from airflow_eo.sqlstore.rows import insert_audit

#: The store's tables keyed by pipeline id, renamed together (eo_pipeline last: its row is the one locked).
PIPELINE_TABLES = ("eo_offset", "eo_batch", "eo_interval", "eo_audit")


class StoreLifecycle:
    """Retire (the tombstone), bring back, rename."""

    dialect: StoreDialect

    def transaction(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def migrate(self) -> None:
        raise NotImplementedError

    def _locked(self, cur: Any, pipeline_id: str, expected_epoch: int | None) -> dict[str, Any]:
        """The pipeline's row, locked; refused when its epoch moved since the caller looked, or a batch is
        unfinished."""
        cur.execute(f"SELECT epoch, retired_at FROM eo_pipeline WHERE pipeline_id = %s {self.dialect.exclusive_lock}",
                    (pipeline_id,))
        row = cur.fetchone()
        if row is None:
            raise UnknownPipelineError(f"the offset store has no pipeline {pipeline_id!r}")
        if expected_epoch is not None and int(row["epoch"]) != expected_epoch:
            raise OperationError(f"pipeline {pipeline_id!r} was taken since this command looked (epoch "
                                 f"{expected_epoch} -> {row['epoch']}): a run started; nothing was changed, run the "
                                 "command again once it ended")
        cur.execute("SELECT batch_id, state FROM eo_batch WHERE pipeline_id = %s AND state IN (%s, %s) "
                    "ORDER BY batch_id", (pipeline_id, *[s.value for s in UNFINISHED]))
        unfinished = cur.fetchall()
        if unfinished:
            listed = ", ".join(f"{r['batch_id']} ({r['state']})" for r in unfinished)
            raise OperationError(f"pipeline {pipeline_id!r} has unfinished batches ({listed}); nothing was changed: "
                                 f"airflow eo recover {pipeline_id} --apply --reason TEXT resolves them")
        return dict(row)

    def _take(self, cur: Any, pipeline_id: str, epoch: int, extra_sql: str = "") -> int:
        cur.execute(f"UPDATE eo_pipeline SET epoch = epoch + 1, taken_at = {self.dialect.now}{extra_sql} "
                    "WHERE pipeline_id = %s", (pipeline_id,))
        return epoch + 1

    def retire(self, pipeline_id: str, actor: str, reason: str, expected_epoch: int | None,
               details: dict[str, Any]) -> int:
        """Mark the pipeline retired (its row is the tombstone that refuses its next take), take its epoch and append
        the audit row, in one transaction.

        :param pipeline_id: the pipeline.
        :param actor: who.
        :param reason: why.
        :param expected_epoch: the epoch the caller saw (None: any).
        :param details: what the retire removes (the audit row's details).
        :return: the epoch taken.
        """
        self.migrate()
        with self.transaction() as cur:
            row = self._locked(cur, pipeline_id, expected_epoch)
            if row["retired_at"] is not None:
                raise OperationError(f"pipeline {pipeline_id!r} is retired already")
            epoch = self._take(cur, pipeline_id, int(row["epoch"]), f", retired_at = {self.dialect.now}")
            insert_audit(cur, pipeline_id, epoch, actor, RETIRE_ACTION, reason, details)
            return epoch

    def unretire(self, pipeline_id: str, actor: str, reason: str) -> int:
        """Bring a retired pipeline back (its next run continues from its committed offsets), audited."""
        self.migrate()
        with self.transaction() as cur:
            row = self._locked(cur, pipeline_id, None)
            if row["retired_at"] is None:
                raise OperationError(f"pipeline {pipeline_id!r} is not retired: there is nothing to undo")
            epoch = self._take(cur, pipeline_id, int(row["epoch"]), ", retired_at = NULL")
            insert_audit(cur, pipeline_id, epoch, actor, UNRETIRE_ACTION, reason,
                         {"retired_at": str(row["retired_at"])})
            return epoch

    def create_pipeline(self, pipeline_id: str) -> None:
        """The pipeline's row, without owner, mode or sink (its first take records them), when it has none."""
        self.migrate()
        with self.transaction() as cur:
            cur.execute(self.dialect.insert_ignoring("eo_pipeline", ("pipeline_id", "epoch"), ("pipeline_id",),
                                                     ("%s", "0")), (pipeline_id,))

    def rename(self, old: str, new: str, actor: str, reason: str, expected_epoch: int,
               check: Callable[[bool], None], before_commit: Callable[[], Any] | None = None) -> int:
        """Give every row of ``old`` (pipeline, offsets, batches, intervals, audit) the id ``new``, take the epoch
        and append the audit row (under ``new``), in one transaction.

        :param old: the pipeline.
        :param new: its new id.
        :param actor: who.
        :param reason: why.
        :param expected_epoch: the epoch the caller saw.
        :param check: the refusal rules, given whether ``new`` exists, run under the lock.
        :param before_commit: what else moves with it (the sink's rows keyed by the pipeline, its group), run last
            under the lock; if it raises, nothing changes here.
        :return: the epoch taken.
        """
        self.migrate()
        with self.transaction() as cur:
            row = self._locked(cur, old, expected_epoch)
            cur.execute("SELECT 1 FROM eo_pipeline WHERE pipeline_id = %s", (new,))
            check(cur.fetchone() is not None)
            if row["retired_at"] is not None:
                raise OperationError(f"pipeline {old!r} is retired")
            for table in PIPELINE_TABLES:
                cur.execute(f"UPDATE {table} SET pipeline_id = %s WHERE pipeline_id = %s", (new, old))
            cur.execute("UPDATE eo_pipeline SET pipeline_id = %s WHERE pipeline_id = %s", (new, old))
            epoch = self._take(cur, new, int(row["epoch"]))
            insert_audit(cur, new, epoch, actor, RENAME_ACTION, reason, {"from": old, "to": new})
            if before_commit is not None:
                before_commit()
            return epoch
