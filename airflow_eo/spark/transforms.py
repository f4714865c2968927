"""A pipeline's transform: a callable, a dotted path to one, or Spark SQL over the batch's view, resolved once when
the engine is made and applied to the good records of a batch.

Separate from the engine because the write passes and the change batches apply it too, and a DAG's transform is
resolved (and refused with a clear error) before any side effect.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from airflow_eo.core.batch import BatchContext
from airflow_eo.core.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

BATCH_VIEW = "kafka_batch"  # temp view name for SQL transforms

Transform = Callable[["DataFrame", BatchContext], "DataFrame"]
#: A pipeline's transform as the write passes apply it ``(spark, good records, batch) -> output``.
ApplyTransform = Callable[["SparkSession", "DataFrame", BatchContext], "DataFrame"]


def resolve_transform(transform: Transform | str | None) -> Transform | str | None:
    """A callable, a dotted path ``pkg.module.func`` (or ``pkg.module:func``), or Spark SQL text."""
    if transform is None or callable(transform):
        return transform
    if not isinstance(transform, str):
        raise ConfigurationError(f"transform must be a callable, a dotted path or SQL, not {type(transform).__name__}")
    text = transform.strip()
    if text.split(None, 1)[0].upper() in ("SELECT", "WITH"):
        return text
    module_name, _, attr = text.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"transform {text!r} is neither SQL (SELECT ... FROM {BATCH_VIEW}) nor an importable "
            f"dotted path to a function (DataFrame, BatchContext) -> DataFrame: {exc}"
        ) from exc


def apply_transform(spark: SparkSession, good: DataFrame, batch: BatchContext, transform: Transform | str | None,
                    metadata: Sequence[str]) -> DataFrame:
    """The transform of the batch's good records (``metadata``: the metadata columns, dropped without a transform)."""
    if transform is None:
        return good.drop(*metadata)
    if isinstance(transform, str):
        good.createOrReplaceTempView(BATCH_VIEW)
        return spark.sql(transform)
    return transform(good, batch)
