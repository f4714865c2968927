"""Columns by their exact names, whatever they hold (output columns may have any name the sink's database allows)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def named_columns(names: Iterable[str]) -> list[Column]:
    """Top-level columns by their exact names: a name as text is parsed by Spark (``a.b`` is field ``b`` of ``a``),
    so every name is backquoted, a backquote doubled (output columns may hold anything the sink's database does)."""
    from pyspark.sql import functions as F

    return [F.col("`" + name.replace("`", "``") + "`") for name in names]


def positional(df: DataFrame) -> tuple[DataFrame, list[str]]:
    """``df`` with its columns renamed ``_eo_c0``, ``_eo_c1`` .., and their names: mapInArrow refers to its input's
    columns by name, which Spark parses (a backquote in one fails), so the names go positional in between and each
    task gives its Arrow batches the exact ones back (``batch.rename_columns(names)``)."""
    names = list(df.columns)
    return df.toDF(*(f"_eo_c{i}" for i in range(len(names)))), names


def computed_once(df: DataFrame, name: str, value: Column) -> DataFrame:
    """``df`` with column ``name`` holding ``value``, which Spark computes once per row however often the plan above
    reads it: a filter above is not pushed beneath it, where Spark's optimizer would inline ``value`` into every
    reference (a parse read by a filter on its error was parsed ~20 times per record).

    The barrier is an observation (a count nobody reads): Spark pushes no filter through one. A Generate (exploding a
    one-element array) did the same, measured slower: 1,000,000 page views read, parsed and counted in 5.40 s median
    against 5.08 s (six rounds each, one session), the Generate copying every parsed row once more."""
    from pyspark.sql import functions as F

    return df.withColumn(name, value).observe(f"airflow_eo_once_{uuid.uuid4().hex}", F.count(F.lit(1)))
