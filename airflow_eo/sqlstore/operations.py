"""What ``airflow eo`` and the DAG tab read of a SQL offset store, the audit log, and the audited rewind.

A mixin of :class:`~airflow_eo.sqlstore.store.SqlOffsetStore` (its ``transaction()``, ``migrate()`` and
``dialect``): the protocol's writes stay in ``store.py``, the operations' reads and repairs here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any

from airflow_eo.core.batch import BatchRecord
from airflow_eo.core.batch_states import UNFINISHED
from airflow_eo.core.config import Mode, SinkRecord
from airflow_eo.core.errors import OperationError, UnknownPipelineError
from airflow_eo.core.pipeline_status import AuditEntry, BatchInfo, PipelineInfo
from airflow_eo.core.ranges import TopicPartition
from airflow_eo.core.rewind import RewindPlan
from airflow_eo.sqlstore.dialect import StoreDialect
from airflow_eo.sqlstore.rows import batch_info, batch_record, insert_audit, row_owner, utc

PIPELINE_COLUMNS = "pipeline_id, epoch, owner, owner_dag_id, owner_task_id, mode, taken_at, sink, retired_at"


def pipeline_info(row: dict[str, Any], taken_at: datetime | None) -> PipelineInfo:
    return PipelineInfo(row["pipeline_id"], int(row["epoch"]), row["owner"], Mode(row["mode"]) if row["mode"] else None,
                        taken_at, SinkRecord.from_json(row["sink"]) if row["sink"] else None, row_owner(row),
                        utc(row.get("retired_at")))


class StoreOperations:
    """What the operations read of the store (in UTC) and write to it (the audit log, the rewind)."""

    dialect: StoreDialect

    def transaction(self) -> AbstractContextManager[Any]:
        """One connection, one transaction (committed on success, rolled back on error); rows as dicts."""
        raise NotImplementedError

    def migrate(self) -> None:
        raise NotImplementedError

    @property
    def _limit(self) -> str:
        """The dialect's clause keeping the first ``%s`` rows."""
        return self.dialect.limit.format(n="%s")

    @contextmanager
    def _utc_reads(self) -> Iterator[Any]:
        """A transaction whose timestamp columns read as UTC (the session's time zone converts them)."""
        self.migrate()
        with self.transaction() as cur:
            cur.execute(self.dialect.utc_session)
            yield cur

    def pipelines(self, pipeline_id: str | None = None) -> list[PipelineInfo]:
        """Every pipeline in the store (or the one named), sorted by id.

        :param pipeline_id: only this pipeline.
        """
        where, args = ("WHERE pipeline_id = %s", (pipeline_id,)) if pipeline_id is not None else ("", ())
        with self._utc_reads() as cur:
            cur.execute(f"SELECT {PIPELINE_COLUMNS} FROM eo_pipeline {where} ORDER BY pipeline_id", args)
            return [pipeline_info(r, utc(r["taken_at"])) for r in cur.fetchall()]

    def pipeline(self, pipeline_id: str) -> PipelineInfo:
        """The pipeline's row; :class:`UnknownPipelineError` (naming the known ones) when there is none.

        :param pipeline_id: the pipeline.
        """
        found = self.pipelines(pipeline_id)
        if found:
            return found[0]
        known = [p.pipeline_id for p in self.pipelines()]
        listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        raise UnknownPipelineError(f"the offset store has no pipeline {pipeline_id!r}; "
                                   + (f"its pipelines are: {listed}" if known else "it holds no pipeline yet"))

    def all_committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Every pipeline's committed offsets, in one query."""
        with self._utc_reads() as cur:
            cur.execute("SELECT pipeline_id, topic, kafka_partition, next_offset FROM eo_offset")
            found: dict[str, dict[TopicPartition, int]] = {}
            for r in cur.fetchall():
                found.setdefault(r["pipeline_id"], {})[(r["topic"], r["kafka_partition"])] = int(r["next_offset"])
            return found

    def latest_batches(self) -> dict[str, BatchInfo]:
        """Each pipeline's newest batch: its id by one index lookup per pipeline, then the rows by key, in bounded
        statements. (One GROUP BY over the batch log read all of it on PostgreSQL, which has no loose index scan:
        8x slower with 1,000,000 rows; a correlated MAX read every index entry of each pipeline on MariaDB, 77x.
        scripts/store_size.py measures both.)"""
        with self._utc_reads() as cur:
            # ORDER BY .. LIMIT 1, not MAX(): MariaDB reads every index entry of the pipeline for a correlated MAX.
            cur.execute("SELECT p.pipeline_id, (SELECT m.batch_id FROM eo_batch m WHERE m.pipeline_id = p.pipeline_id "
                        f"ORDER BY m.batch_id DESC {self.dialect.limit.format(n='1')}) AS batch_id FROM eo_pipeline p")
            newest = [(r["pipeline_id"], int(r["batch_id"])) for r in cur.fetchall() if r["batch_id"] is not None]
            found: dict[str, BatchInfo] = {}
            for i in range(0, len(newest), 500):
                chunk = newest[i:i + 500]
                cur.execute("SELECT * FROM eo_batch WHERE "  # an OR of keys: a range of key lookups on both
                            + " OR ".join(["(pipeline_id = %s AND batch_id = %s)"] * len(chunk)),
                            [v for key in chunk for v in key])
                found.update({r["pipeline_id"]: batch_info(r) for r in cur.fetchall()})
            return found

    def batch_history(self, pipeline_id: str, limit: int, batch_ids: list[int] | None = None) -> list[BatchInfo]:
        """The pipeline's batches, newest first.

        :param pipeline_id: the pipeline.
        :param limit: at most this many.
        :param batch_ids: only these batches.
        """
        where, args = "pipeline_id = %s", list[Any]([pipeline_id])
        if batch_ids is not None:
            if not batch_ids:
                return []
            where += f" AND batch_id IN ({', '.join(['%s'] * len(batch_ids))})"
            args.extend(batch_ids)
        with self._utc_reads() as cur:
            cur.execute(f"SELECT * FROM eo_batch WHERE {where} ORDER BY batch_id DESC {self._limit}", (*args, limit))
            return [batch_info(r) for r in cur.fetchall()]

    def runs_recorded(self, pipeline_ids: Sequence[str], run_ids: Sequence[str]) -> dict[str, str]:
        """Which of ``pipeline_ids`` recorded a batch of each of ``run_ids`` (``airflow eo verify``: a run of the
        task that another pipeline id recorded is that pipeline's); run id -> pipeline id, the runs none recorded
        left out. By the primary key's pipeline prefix.

        :param pipeline_ids: the pipelines to look in (the task's other pipelines).
        :param run_ids: the runs asked about.
        """
        if not pipeline_ids or not run_ids:
            return {}
        found: dict[str, str] = {}
        with self._utc_reads() as cur:
            for i in range(0, len(run_ids), 500):  # bounded statements
                chunk = list(run_ids[i:i + 500])
                pipelines, runs = ", ".join(["%s"] * len(pipeline_ids)), ", ".join(["%s"] * len(chunk))
                cur.execute(f"SELECT pipeline_id, run_id FROM eo_batch WHERE pipeline_id IN ({pipelines}) "
                            f"AND run_id IN ({runs})", (*pipeline_ids, *chunk))
                found.update({r["run_id"]: r["pipeline_id"] for r in cur.fetchall()})
        return found

    def audit_log(self, pipeline_id: str, limit: int) -> list[AuditEntry]:
        """What people did to the pipeline (``eo_audit``), newest first.

        :param pipeline_id: the pipeline.
        :param limit: at most this many.
        """
        with self._utc_reads() as cur:
            cur.execute(f"SELECT * FROM eo_audit WHERE pipeline_id = %s ORDER BY audit_id DESC {self._limit}",
                        (pipeline_id, limit))
            return [AuditEntry(int(r["audit_id"]), r["pipeline_id"], utc(r["created_at"]), r["actor"], r["action"],
                               r["reason"], None if r["epoch"] is None else int(r["epoch"]),
                               json.loads(r["details"]) if r["details"] else {})
                    for r in cur.fetchall()]

    def take_audited(self, pipeline_id: str, actor: str, action: str, reason: str, details: dict[str, Any]) -> int:
        """Take the pipeline's epoch (fencing any running attempt) and append the audit row, in one transaction:
        an operation that then fails midway is on record (``details`` says what it set out to do).

        :param pipeline_id: the pipeline (it must exist).
        :param actor: who runs the operation.
        :param action: what (``recover``).
        :param reason: why, in the operator's words.
        :param details: what it is about to change (JSON); :meth:`complete_audit` replaces it with what it did.
        :return: the epoch taken.
        """
        self.migrate()
        with self.transaction() as cur:
            cur.execute(f"UPDATE eo_pipeline SET epoch = epoch + 1, taken_at = {self.dialect.now} "
                        "WHERE pipeline_id = %s", (pipeline_id,))
            if cur.rowcount != 1:
                raise UnknownPipelineError(f"the offset store has no pipeline {pipeline_id!r}")
            cur.execute("SELECT epoch FROM eo_pipeline WHERE pipeline_id = %s", (pipeline_id,))
            epoch = int(cur.fetchone()["epoch"])
            insert_audit(cur, pipeline_id, epoch, actor, action, reason, details)
            return epoch

    def record_audit(self, pipeline_id: str, actor: str, action: str, reason: str, details: dict[str, Any]) -> None:
        """Append an audit row without taking an epoch: what was done to something no pipeline of the store owns
        (``recover --orphans --unknown rollback``: ``pipeline_id`` names the branch's key then)."""
        self.migrate()
        with self.transaction() as cur:
            insert_audit(cur, pipeline_id, None, actor, action, reason, details)

    def complete_audit(self, pipeline_id: str, epoch: int, action: str, details: dict[str, Any]) -> None:
        """Replace the details of the audit row :meth:`take_audited` wrote (what the operation did).

        :param pipeline_id: the pipeline.
        :param epoch: the epoch the operation took (one audit row per epoch taken).
        :param action: the operation.
        :param details: what it did (JSON).
        """
        with self.transaction() as cur:
            cur.execute("UPDATE eo_audit SET details = %s WHERE pipeline_id = %s AND epoch = %s AND action = %s",
                        (json.dumps(details), pipeline_id, epoch, action))

    def rewind(self, plan: RewindPlan, actor: str, reason: str,
               check: Callable[[PipelineInfo, list[BatchRecord]], None], overrides: Sequence[str] = (),
               before_commit: Callable[[], None] | None = None) -> int:
        """Move the pipeline's committed offsets as planned, in one transaction with the take and the audit row.

        Under the pipeline row's lock (which every fenced write of an attempt takes too): ``check`` sees the
        pipeline and its unfinished batches and may refuse; every moved offset must still be where the plan
        found it (else nothing changes); the epoch moves on (fencing any running attempt); the audit row
        records who, why, and old and new offsets. Any failure rolls all of it back.

        :param plan: the rewind (old -> new per partition).
        :param actor: who runs it.
        :param reason: why.
        :param check: the refusal rules (:func:`airflow_eo.core.rewind.check_rewind`), run under the lock.
        :param overrides: the refusals the operator overrode (their command-line flags), recorded in the audit row.
        :param before_commit: what else must move with the offsets (a Kafka sink's consumer group), run last
            under the lock, once nothing here can refuse any more; if it raises, nothing changes here.
        :return: the epoch taken.
        """
        p = plan.pipeline_id
        self.migrate()
        with self.transaction() as cur:
            cur.execute(f"SELECT {PIPELINE_COLUMNS} FROM eo_pipeline WHERE pipeline_id = %s "
                        f"{self.dialect.exclusive_lock}", (p,))
            row = cur.fetchone()
            if row is None:
                raise UnknownPipelineError(f"the offset store has no pipeline {p!r}")
            info = pipeline_info(row, row["taken_at"])
            cur.execute("SELECT * FROM eo_batch WHERE pipeline_id = %s AND state IN (%s, %s) ORDER BY batch_id",
                        (p, *[s.value for s in UNFINISHED]))
            check(info, [batch_record(r) for r in cur.fetchall()])
            for change in plan.moved:
                if change.old is None:  # never committed: the next batch would start at starting_offsets
                    cur.execute(self.dialect.insert_ignoring(
                        "eo_offset", ("pipeline_id", "topic", "kafka_partition", "next_offset", "batch_id"),
                        ("pipeline_id", "topic", "kafka_partition"), ("%s", "%s", "%s", "%s", "-1")),
                        (p, change.topic, change.partition, change.new))
                else:
                    cur.execute("UPDATE eo_offset SET next_offset = %s WHERE pipeline_id = %s AND topic = %s AND "
                                "kafka_partition = %s AND next_offset = %s",
                                (change.new, p, change.topic, change.partition, change.old))
                if cur.rowcount != 1:
                    raise OperationError(f"{change.topic}[{change.partition}] of pipeline {p!r} moved since the "
                                         "rewind was planned (a batch committed meanwhile); nothing was changed: "
                                         "run the command again")
            cur.execute(f"UPDATE eo_pipeline SET epoch = epoch + 1, taken_at = {self.dialect.now} "
                        "WHERE pipeline_id = %s", (p,))
            epoch = info.epoch + 1
            insert_audit(cur, p, epoch, actor, "rewind", reason, {**plan.to_dict(), "overrides": list(overrides)})
            if before_commit is not None:
                before_commit()
            return epoch
