"""The Spark side of rows a table refuses only when written (:mod:`airflow_eo.core.refused_rows`): a write task's
refusal marked so the driver can tell it, the job that finds the refused records by probing, and the parsed records
with those marked bad."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_eo.core.refused_rows import LOCK_WAIT_MARK, REFUSED_MARK, isolate_refused
from airflow_eo.spark.columns import named_columns, positional

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_POSITION = ("_eo_ref_topic", "_eo_ref_partition", "_eo_ref_offset")
#: A record's raw fields: what a dead letter keeps of it besides its position and its error.
RAW_FIELDS = ("kafka_key", "kafka_value", "kafka_headers")
_MARKED = re.compile(re.escape(REFUSED_MARK) + r" ([^\n]*)")
_LOCK_WAITED = re.compile(re.escape(LOCK_WAIT_MARK) + r" ([^\n]*)")


class WriteRefused(Exception):
    """A partition writer's task failed on a row its table refuses (the job's error held :data:`REFUSED_MARK`), or,
    ``lock_wait``, a two-phase write task waited too long for a row lock (:data:`LOCK_WAIT_MARK`: perhaps another
    task's prepared branch holds a value of a unique index its rows also hold)."""

    def __init__(self, writer: Any, error: str, lock_wait: bool = False) -> None:
        super().__init__(f"a write task waited on a row lock: {error}" if lock_wait else
                         f"the table refused a row: {error}")
        self.writer = writer
        self.error = error
        self.lock_wait = lock_wait


@dataclass(frozen=True, order=True)
class RefusedRecord:
    """A record whose output row the table refused alone, with the database's error."""

    topic: str
    partition: int
    offset: int
    error: str


def raise_if_refused(writer: Any, exc: BaseException) -> None:
    """In a write task: re-raise ``exc`` marked when ``writer`` says it is its table refusing a row's values, or its
    two-phase write's wait for a row lock running out."""
    refusal = getattr(writer, "refusal", None)
    text = refusal(exc) if callable(refusal) else None
    if text is not None:
        raise RuntimeError(f"{REFUSED_MARK} {text}") from exc
    lock_waited = getattr(writer, "lock_waited", None)
    if callable(lock_waited) and lock_waited(exc):
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise RuntimeError(f"{LOCK_WAIT_MARK} {first_line}") from exc


def refused_write(writer: Any, exc: BaseException) -> WriteRefused | None:
    """On the driver: the failed write job's error as :class:`WriteRefused` when a task marked it (a refusal, or a
    lock wait) and ``writer`` can probe, else None."""
    if not hasattr(writer, "probe"):
        return None
    found = _MARKED.search(str(exc))
    if found is not None:
        return WriteRefused(writer, found.group(1).strip())
    waited = _LOCK_WAITED.search(str(exc))
    return None if waited is None else WriteRefused(writer, waited.group(1).strip(), lock_wait=True)


def find_refused(parsed: DataFrame, writer: Any, partitions: int) -> tuple[list[RefusedRecord], bool]:
    """The good records whose rows ``writer``'s table refuses (alone, or after an earlier record of the task: one
    value of a unique index), in one Spark job: every task gets the rows the write's task of its number got (the same
    spread by key) and isolates its refused rows with probes, in transactions its writer rolls back (which also
    roll back the failed write's prepared branches of the task). Returns the records found, by position, and
    whether some task found more than it isolates one by one (its records refused as sets are among them)."""
    from pyspark.sql import functions as F

    columns = list(writer.columns)
    source = parsed.where(F.col("_eo_error").isNull()).select(
        *named_columns(columns), *(F.col(c).alias(a) for c, a in zip(
            ("kafka_topic", "kafka_partition", "kafka_offset"), _POSITION, strict=True)))
    keyed, names = positional(source.repartition(partitions, *named_columns(writer.key_columns)))
    probing = dataclasses.replace(writer, probe=True)

    def isolate(renamed: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        batches = [batch.rename_columns(names) for batch in renamed if batch.num_rows]
        if not batches:
            return
        # In the records' order: of two records the table takes only one of (one value of a unique index), the
        # later is refused, whichever order the shuffle brought them in.
        table = pa.Table.from_batches(batches).sort_by([(name, "ascending") for name in _POSITION])
        rows = table.select(columns)
        ctx = TaskContext.get()
        assert ctx is not None, "mapInArrow runs this inside a Spark task"

        def probe(indexes: Sequence[int]) -> str | None:
            some = (rows.slice(indexes[0], len(indexes)) if isinstance(indexes, range) and indexes.step == 1
                    else rows.take(pa.array(indexes, pa.int64())))
            try:
                probing(some.to_batches(), ctx.partitionId(), ctx.stageId(), ctx.taskAttemptId())
            except Exception as exc:
                text = probing.refusal(exc)
                if text is None:
                    raise
                return str(text)
            return None

        found, more = isolate_refused(table.num_rows, probe)
        at = table.select(list(_POSITION)).take(pa.array([row.index for row in found], pa.int64()))
        yield pa.RecordBatch.from_pydict(
            {"topic": at.column(0).combine_chunks(), "partition": at.column(1).combine_chunks(),
             "offset": at.column(2).combine_chunks(), "error": [row.error for row in found],
             "more": [more] * len(found)},
            schema=pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                              ("error", pa.string()), ("more", pa.bool_())]))

    rows = keyed.mapInArrow(isolate, "topic string, partition int, offset long, error string, more boolean").collect()
    found = sorted(RefusedRecord(r["topic"], r["partition"], r["offset"], r["error"]) for r in rows)
    return found, any(r["more"] for r in rows)


def mark_refused(parsed: DataFrame, refused: list[RefusedRecord], table: str,
                 originals: DataFrame | None = None) -> DataFrame:
    """``parsed`` with each refused record a bad record (``_eo_error`` names the table and the database's error).
    ``originals``: the records ``parsed`` was made from, when ``parsed``'s good records no longer carry their raw
    fields (:data:`RAW_FIELDS`, :func:`without_raw_fields`): a refused record's are taken from there."""
    from pyspark.sql import functions as F

    spark = parsed.sparkSession
    found = spark.createDataFrame(
        [(r.topic, r.partition, r.offset, f"table {table} refused it: {r.error}") for r in refused],
        f"{_POSITION[0]} string, {_POSITION[1]} int, {_POSITION[2]} long, _eo_ref_error string")
    on = ((F.col("kafka_topic") == F.col(_POSITION[0])) & (F.col("kafka_partition") == F.col(_POSITION[1]))
          & (F.col("kafka_offset") == F.col(_POSITION[2])))
    marked = parsed.join(F.broadcast(found), on, "left").withColumn(
        "_eo_error", F.coalesce(F.col("_eo_error"), F.col("_eo_ref_error"))).drop(*found.columns)
    if originals is None:
        return marked
    # A job over the batch's records again, on a path rare by nature: a refusal already costs a round of probes.
    return _raw_fields_back(marked, originals.join(F.broadcast(found), on, "left_semi"), few=True)


def mark_all_refused(parsed: DataFrame, error: str, originals: DataFrame | None = None) -> DataFrame:
    """``parsed`` with every good record a bad record whose ``_eo_error`` is ``error`` (a refused row that no record
    can be blamed for alone: a transform's output). ``originals`` as for :func:`mark_refused`."""
    from pyspark.sql import functions as F

    marked = parsed.withColumn("_eo_error", F.coalesce(F.col("_eo_error"), F.lit(error)))
    return marked if originals is None else _raw_fields_back(marked, originals)


def _raw_fields_back(marked: DataFrame, originals: DataFrame, few: bool = False) -> DataFrame:
    """``marked`` with the raw fields its records lack taken from ``originals`` (the records, by position; ``few``:
    so few that every task gets them all)."""
    from pyspark.sql import functions as F

    position = ("kafka_topic", "kafka_partition", "kafka_offset")
    raw = originals.select(*(F.col(c).alias(a) for c, a in zip(position, _POSITION, strict=True)),
                           *(F.col(c).alias(f"_eo_ref_{c}") for c in RAW_FIELDS))
    if few:
        raw = F.broadcast(raw)
    on = [F.col(c) == F.col(a) for c, a in zip(position, _POSITION, strict=True)]
    return marked.join(raw, on, "left").select(
        *(F.coalesce(F.col(c), F.col(f"_eo_ref_{c}")).alias(c) if c in RAW_FIELDS else F.col(c)
          for c in marked.columns))


def without_raw_fields(records: DataFrame) -> DataFrame:
    """``records`` whose good records carry no raw fields (:data:`RAW_FIELDS`, NULL): only a bad record's become a
    dead letter's, and a change stream spreads its records by key before it knows which of them it writes (a
    value is most of a record's bytes). :func:`mark_refused` brings back a refused record's."""
    from pyspark.sql import functions as F

    bad = F.col("_eo_error").isNotNull()
    return records.select(*(F.when(bad, F.col(c)).alias(c) if c in RAW_FIELDS else F.col(c)
                            for c in records.columns))
