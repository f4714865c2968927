"""The run-time side every table-format sink shares: the protocol steps around a table commit made inside
``write``, its retries against other writers, and the Spark parts of the write (one row per key, the ``MERGE``
clauses)."""

from __future__ import annotations

import logging
import random
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from airflow_eo.core.abilities import no_dead_letters
from airflow_eo.core.drivers import require_driver
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import backquote
from airflow_eo.core.recovery import SinkRecovery
from airflow_eo.core.sink_kinds import KindAdapter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_eo.core.batch import BatchContext, BatchRecord, DeadLetter

log = logging.getLogger(__name__)
R = TypeVar("R")
#: the column that keeps offset order through the shuffle of :meth:`TableCommitAdapter.merge_source`
ORDER = "_eo_order"


class TableCommitAdapter(KindAdapter, ABC):
    """The protocol steps shared by the table sinks whose format's own commit, made inside ``write``, is the commit
    point (Delta, Iceberg): recovery rolls forward the batches the table has; nothing to commit, finalize, hold or
    discard after ``write`` (a table commit is all or nothing); no dead letters."""

    name: str
    #: empty: append; else the MERGE key
    key_columns: tuple[str, ...]
    #: ``replace`` / ``add`` per non-key column (MERGE only)
    updates: dict[str, str]
    #: partition columns of a table created here
    partition_by: tuple[str, ...]

    def check(self) -> None:
        """The format's library, which reads the table's log on the driver (no Spark), is installed."""
        require_driver(self.capabilities.required_driver)

    def missing_output_columns(self, out: DataFrame) -> None:
        """Refuse an output that lacks a key, update or partition column, naming what it has."""
        missing = [c for c in (*self.key_columns, *self.updates, *self.partition_by) if c not in out.columns]
        if missing:
            raise ConfigurationError(f"{self.name}: the transform's output lacks column(s) {', '.join(missing)}; "
                                     f"it has {', '.join(out.columns)}")

    def merge_source(self, out: DataFrame) -> DataFrame:
        """One row per key: of several rows of one key the last in offset order wins, ``add`` columns add up every
        row's value (a MERGE refuses a source with two rows for one target row)."""
        from pyspark.sql import functions as F

        # The output's rows come in offset order within each Spark partition (one Kafka partition's range): the
        # increasing id keeps that order through the shuffle of the aggregation.
        ordered = out.withColumn(ORDER, F.monotonically_increasing_id())
        added = [c for c in out.columns if self.updates.get(c) == "add"]
        kept = [c for c in out.columns if c not in self.key_columns and c not in added]
        aggregates = [F.max_by(F.struct(*[F.col(c) for c in kept]), F.col(ORDER)).alias("_eo_last")] if kept else []
        aggregates += [F.sum(F.col(c)).cast(out.schema[c].dataType).alias(c) for c in added]
        source = ordered.groupBy(*self.key_columns).agg(*aggregates)
        return source.select(*self.key_columns, *[F.col(f"_eo_last.{c}").alias(c) for c in kept], *added)

    def merge_clauses(self, columns: Sequence[str]) -> tuple[str, str]:
        """``(ON condition, UPDATE SET assignments)`` of a MERGE of source ``s`` into target ``t`` on the key:
        ``add`` columns add the source's value, the others take it (empty assignments: only key columns)."""
        on = " AND ".join(f"t.{backquote(k)} = s.{backquote(k)}" for k in self.key_columns)
        sets = ", ".join(f"t.{backquote(c)} = " + (f"t.{backquote(c)} + s.{backquote(c)}"
                                                   if self.updates.get(c) == "add" else f"s.{backquote(c)}")
                         for c in columns if c not in self.key_columns)
        return on, sets

    @abstractmethod
    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]:
        """The unfinished batches the table committed but the store did not."""

    @property
    @abstractmethod
    def table_label(self) -> str:
        """The table, for messages (``the Delta table at /data/t``)."""

    #: a table commit's tries against other writers' conflicts, and the first wait between them (doubled each time)
    commit_tries: ClassVar[int] = 5
    commit_backoff_s: ClassVar[float] = 0.5

    def commit_with_retries(self, batch_id: int, commit: Callable[[], R],
                            conflict: Callable[[BaseException], str | None], committed: Callable[[], bool]) -> R | None:
        """``commit()`` the batch to the table, retrying when it conflicts with another writer of the table (a
        pipeline, a compaction job): ``conflict`` names what makes an error one (None: another error, raised).
        Before each retry the table is asked again: a batch it has now (``committed()``: a zombie's commit refused
        because a newer attempt made it) is not written again, and None is returned. Bounded: the last conflict is
        raised (the batch fails before its commit point)."""
        for attempt in range(1, self.commit_tries + 1):
            try:
                return commit()
            except Exception as exc:
                what = conflict(exc)
                if what is None:
                    raise
                log.warning("%s: %s refused the commit of batch %d: %s (%s)", self.name, self.table_label, batch_id,
                            what, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300])
                if committed():
                    return None
                if attempt == self.commit_tries:
                    raise
                wait = self.commit_backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)  # apart from the other
                log.warning("%s: batch %d is not in %s: a conflict with another writer; retrying in %.1f s (try %d "
                            "of %d)", self.name, batch_id, self.table_label, wait, attempt + 1, self.commit_tries)
                time.sleep(wait)
        raise AssertionError("unreachable: the last try returns or raises")

    def recover(self, pipeline_id: str, batch_lookup: Callable[[int], BatchRecord | None],
                unfinished: Sequence[BatchRecord] = ()) -> SinkRecovery:
        """Name the unfinished batches the table already committed."""
        if not unfinished:
            return SinkRecovery()
        committed = self.committed_batches(unfinished)
        for batch_id in sorted(committed):
            log.warning("%s: %s committed batch %d but the store did not record it; rolling forward", self.name,
                        self.table_label, batch_id)
        return SinkRecovery(committed=frozenset(committed))

    def commit(self, batch: BatchRecord) -> None:
        return None  # the table committed in write(); an empty batch wrote nothing: the store's commit is all

    def finalize(self, batch: BatchRecord, xids: Sequence[str]) -> None:
        return None

    def can_hold_writes(self, out: Any) -> bool:
        return False

    def write_dead_letters(self, batch: BatchContext, records: Iterator[DeadLetter]) -> list[str]:
        return no_dead_letters(self.name, records)

    def discard(self, batch: BatchContext, xids: Sequence[str]) -> None:
        return None  # a table commit is all or nothing: an attempt that failed before it left nothing


def named_failure(exc: BaseException, names: re.Pattern[str]) -> str | None:
    """What in ``exc``'s text, its Python causes' or its Java cause chain (a classic Spark session's errors keep
    the Java exception; py4j and Spark Connect pass Java errors on as text) ``names`` matches; None: nothing."""
    parts: list[str] = []
    current: BaseException | None = exc
    depth = 0
    while current is not None and depth < 10:
        parts.append(f"{type(current).__name__}: {current}")
        origin = getattr(current, "_origin", None) or getattr(current, "java_exception", None)
        for _ in range(10):
            if origin is None:
                break
            try:
                parts.append(str(origin.toString()))
                origin = origin.getCause()
            except Exception:  # a gateway gone: the text so far is all there is
                break
        current, depth = current.__cause__ or current.__context__, depth + 1
    found = names.search("\n".join(parts))
    return found.group(0) if found else None




def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client that cannot add jars or SQL extensions)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def sql_string(text: str) -> str:
    """A Spark SQL string literal (quotes and backslashes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
