"""A Spark task's write chosen as a deadlock's victim by the real MariaDB runs its transaction again (an XA branch:
the whole branch, from its first row), and the batch goes on: the tasks of one batch write one table at once, and
InnoDB's next-key locks make such deadlocks happen between them (seen: 2 in 16 runs of the tombstones test, the
retry of a killed run failing with error 1213).

Each case makes one deadlock on purpose: this test's transaction holds row 1 (and has changed 1,000 other rows, so
the server picks the writer, the lighter one, as the victim); the writer locks row 0 and waits for row 1; then this
transaction asks for row 0."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Any

import pyarrow as pa
import pymysql
import pytest

from airflow_eo.core.xid import Xid, pipeline_key
from airflow_eo.mysql.writer import PartitionWriter
from airflow_eo.mysql.xa import XaFacade

CASES = {
    "staged": {"bulk_load": True},
    "staged-xa": {"bulk_load": True, "xa": True},
    "replacing": {"bulk_load": True, "replace_rows": True},
    "replacing-xa": {"bulk_load": True, "replace_rows": True, "xa": True},
    "statements": {"bulk_load": False},
    # One row a statement: row 0's statement went into the branch before row 1's deadlocked, and the rolled-back
    # branch must write it again (kept on the local disk, as Spark's rows are read once).
    "statements-xa": {"bulk_load": False, "xa": True, "rows_per_statement": 1},
}


def deadlocks(cur: Any) -> int:
    cur.execute("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
    return int(cur.fetchone()[1])


def waiting(cur: Any, table: str) -> bool:
    """Whether a statement on ``table`` waits for a lock."""
    cur.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' "
                "AND trx_query LIKE %s", (f"%{table}%",))
    return int(cur.fetchone()[0]) > 0


@pytest.mark.parametrize("case", CASES)
def test_a_writer_chosen_as_a_deadlocks_victim_runs_its_transaction_again(case, mysql, mysql_kwargs):
    table = f"dl_{uuid.uuid4().hex[:8]}"
    with mysql.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)")
        cur.executemany(f"INSERT INTO `{table}` VALUES (%s, 0)", [(i,) for i in range(2000)])
        before = deadlocks(cur)
    writer = dataclasses.replace(
        PartitionWriter(connect_kwargs=mysql_kwargs, table=table, columns=("id", "v"), key_columns=("id",),
                        updates={}, row_alias=False, rows_per_statement=100, xa=False,
                        pipeline_key=pipeline_key(f"dl-{uuid.uuid4().hex[:6]}"), batch_id=1, epoch=1),
        **CASES[case])
    rows = pa.RecordBatch.from_pylist([{"id": i, "v": 7} for i in range(3)],
                                      schema=pa.schema([("id", pa.int64()), ("v", pa.int64())]))
    holder = pymysql.connect(**mysql_kwargs, autocommit=False)
    outcome: list[Any] = []
    try:
        with holder.cursor() as cur:
            cur.execute(f"UPDATE `{table}` SET v = -1 WHERE id >= 1000 OR id = 1")
        task = threading.Thread(target=lambda: outcome.append(_call(writer, rows)))
        task.start()
        with mysql.cursor() as cur:
            deadline = time.monotonic() + 30
            while not waiting(cur, table):
                assert time.monotonic() < deadline, f"the writer never waited for row 1: {outcome}"
                time.sleep(0.25)  # InnoDB refreshes this table only when nobody read it for 0.1 s
        with holder.cursor() as cur:
            cur.execute(f"UPDATE `{table}` SET v = -1 WHERE id = 0")  # the cycle: the server rolls the writer back
        holder.commit()
        task.join(60)
        assert not task.is_alive()
    finally:
        holder.close()
    [(result, written)] = outcome  # an exception here: the writer failed instead of running again
    assert written == 3, result
    with mysql.cursor() as cur:
        assert deadlocks(cur) == before + 1, "the case made exactly one deadlock"
        if result is not None:
            assert XaFacade(mysql).commit(Xid.decode(result))
        cur.execute(f"SELECT id, v FROM `{table}` WHERE id < 3 OR v = -1 ORDER BY id LIMIT 5")
        assert cur.fetchall() == ((0, 7), (1, 7), (2, 7), (1000, -1), (1001, -1)), "the writer's rows are last"
        cur.execute(f"DROP TABLE `{table}`")


def _call(writer: PartitionWriter, rows: pa.RecordBatch) -> Any:
    try:
        return writer([rows], 0, 0, 0)
    except Exception as exc:  # shown by the test's unpacking
        return exc, None


def test_an_xa_task_attempt_rolls_back_its_earlier_attempts_prepared_branch_and_a_probe_leaves_nothing(
        mysql, mysql_kwargs):
    """A task's new attempt (a Spark retry, or the probes after a refused write) first rolls back the branch its
    earlier attempt prepared, which holds the rows' locks: on the writer's own connection (autocommit off) MariaDB
    refused that XA ROLLBACK with XAER_OUTSIDE, so the attempt failed. A probe then writes and keeps nothing."""
    table = f"dl_{uuid.uuid4().hex[:8]}"
    with mysql.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)")
    writer = PartitionWriter(connect_kwargs=mysql_kwargs, table=table, columns=("id", "v"), key_columns=("id",),
                             updates={}, row_alias=False, rows_per_statement=100, xa=True, bulk_load=True,
                             pipeline_key=pipeline_key(f"dl-{uuid.uuid4().hex[:6]}"), batch_id=1, epoch=1)
    rows = pa.RecordBatch.from_pylist([{"id": i, "v": 7} for i in range(3)],
                                      schema=pa.schema([("id", pa.int64()), ("v", pa.int64())]))
    earlier, _ = writer([rows], 0, 1, 1)
    assert earlier is not None
    probe = dataclasses.replace(writer, probe=True)
    assert probe([rows], 0, 2, 2) == (None, 3)  # waited for no lock: the earlier branch is gone
    xa = XaFacade(mysql)
    assert Xid.decode(earlier) not in xa.recover()
    assert [x for x in xa.recover() if x.pipeline_key == writer.pipeline_key] == []
    later, written = writer([rows], 0, 3, 3)
    assert written == 3 and later is not None and xa.commit(Xid.decode(later))
    with mysql.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM `{table}`")
        assert cur.fetchone()[0] == 3
        cur.execute(f"DROP TABLE `{table}`")
