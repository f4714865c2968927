"""The rows a SQL sink keeps of a pipeline beside its output, for ``airflow eo retire`` (removed) and ``rename``
(moved to the new id): the seen ids of ``dedup_key``, the change positions of ``changes=`` and the store owning them
(keyed by the pipeline's 8-byte key), and the dead letters (keyed by its id). The
:class:`~airflow_eo.core.lifecycle.PipelineRows` role of the SQL table sinks; each operation is one transaction on
the sink's database."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from airflow_eo.core.dedup import seen_pipeline_key
from airflow_eo.sqlsink.change_positions import CHANGE_POSITION_TABLE
from airflow_eo.sqlsink.database import SqlDatabase
from airflow_eo.sqlsink.pipeline_owners import OWNER_TABLE
from airflow_eo.sqlsink.seen_ids import SEEN_ID_TABLE

#: Seconds a prune's DELETE of dead letters waits on a row lock (a prepared branch's) before it fails, and with it the
#: prune of that pipeline (a note; its batches are gone, the dead letters left go at the next prune).
PRUNE_LOCK_WAIT_S = 2
#: The tables keyed by the pipeline's key (``pipeline_key``), in the sink's database.
KEYED_TABLES = (SEEN_ID_TABLE, CHANGE_POSITION_TABLE, OWNER_TABLE)


class SqlPipelineRows:
    """:class:`~airflow_eo.core.lifecycle.PipelineRows` of a SQL table sink (a mixin of
    :class:`~airflow_eo.sqlsink.sink.SqlTableSink`: its ``database``, ``connect_kwargs``, ``dead_letter_table``)."""

    database: ClassVar[SqlDatabase]
    connect_kwargs: dict[str, Any]
    dead_letter_table: str

    @contextmanager
    def _rows_transaction(self) -> Iterator[Any]:
        conn = self.database.connect(self.connect_kwargs, autocommit=False)
        try:
            with conn.cursor() as cur:
                yield cur
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def _tables(self, cur: Any, pipeline_id: str, dead_letters: bool) -> Iterator[tuple[str, str, Any]]:
        """(table, the column naming the pipeline, its value) of every such table that exists."""
        found: list[tuple[str, str, Any]] = [(t, "pipeline_key", seen_pipeline_key(pipeline_id)) for t in KEYED_TABLES]
        if dead_letters:
            found.append((self.dead_letter_table, "pipeline_id", pipeline_id))
        for table, column, value in found:
            if self.database.table_columns(cur, table):
                yield table, column, value

    def pipeline_rows(self, pipeline_id: str, dead_letters: bool) -> dict[str, int]:
        counted: dict[str, int] = {}
        with self._rows_transaction() as cur:
            for table, column, value in self._tables(cur, pipeline_id, dead_letters):
                cur.execute(f"SELECT COUNT(*) FROM {self.database.quote_table(table)} WHERE {column} = %s", (value,))
                counted[table] = int(_first(cur.fetchone()))
        return counted

    def remove_pipeline_rows(self, pipeline_id: str, dead_letters: bool) -> dict[str, int]:
        removed: dict[str, int] = {}
        with self._rows_transaction() as cur:
            for table, column, value in self._tables(cur, pipeline_id, dead_letters):
                cur.execute(f"DELETE FROM {self.database.quote_table(table)} WHERE {column} = %s", (value,))
                removed[table] = max(cur.rowcount, 0)
        return removed

    def prune_dead_letters(self, pipeline_id: str, through_batch: int, keep: Collection[int], apply: bool,
                           chunk: int) -> int:
        """:class:`~airflow_eo.core.history.DeadLetterRetention`: the keys are read without locking (a prepared
        branch's rows are not seen and not waited for), then deleted by key, ``chunk`` at a time, each DELETE its own
        transaction waiting at most :data:`PRUNE_LOCK_WAIT_S` on a row lock."""
        table = self.dead_letter_table
        where = "pipeline_id = %s AND batch_id <= %s" + (
            f" AND batch_id NOT IN ({', '.join(['%s'] * len(keep))})" if keep else "")
        args = (pipeline_id, through_batch, *keep)
        done = 0
        after: tuple[Any, ...] | None = None
        while True:
            with self._rows_transaction() as cur:
                if not self.database.table_columns(cur, table):
                    return 0
                quoted = self.database.quote_table(table)
                if not apply:
                    cur.execute(f"SELECT COUNT(*) FROM {quoted} WHERE {where}", args)
                    return int(_first(cur.fetchone()))
                page = "" if after is None else " AND (topic, kafka_partition, kafka_offset) > (%s, %s, %s)"
                cur.execute(f"SELECT topic, kafka_partition, kafka_offset FROM {quoted} WHERE {where}{page} "
                            f"ORDER BY topic, kafka_partition, kafka_offset LIMIT {int(chunk)}",
                            (*args, *(after or ())))
                keys = [tuple(r.values()) if isinstance(r, Mapping) else tuple(r) for r in cur.fetchall()]
            if not keys:
                return done
            after = keys[-1]
            with self._rows_transaction() as cur:
                cur.execute(self.database.row_lock_wait(PRUNE_LOCK_WAIT_S))
                cur.execute(f"DELETE FROM {quoted} WHERE pipeline_id = %s AND batch_id <= %s AND ("
                            + " OR ".join(["(topic = %s AND kafka_partition = %s AND kafka_offset = %s)"] * len(keys))
                            + ")", (pipeline_id, through_batch, *[v for key in keys for v in key]))
                done += max(cur.rowcount, 0)

    def move_pipeline_rows(self, old: str, new: str) -> dict[str, int]:
        moved: dict[str, int] = {}
        new_values = {"pipeline_key": seen_pipeline_key(new), "pipeline_id": new}
        with self._rows_transaction() as cur:
            for table, column, value in self._tables(cur, old, dead_letters=True):
                also = ", pipeline_id = %s" if table == OWNER_TABLE else ""  # the owner row names the id too
                cur.execute(f"UPDATE {self.database.quote_table(table)} SET {column} = %s{also} WHERE {column} = %s",
                            (new_values[column], *((new,) if also else ()), value))
                moved[table] = max(cur.rowcount, 0)
        return moved


def _first(row: Any) -> Any:
    return next(iter(row.values())) if isinstance(row, Mapping) else row[0]
