"""How many records a batch read and how many of them are bad: counted by a Spark job of its own, or observed on
the way by the job that wrote the output (Spark's observed metrics).

Separate from the engine because every write pass, the refusal rounds, the change batches and the partition runner
count the same way, and reading an observation back differs between a classic session and Spark Connect.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def record_counts() -> list[Any]:
    """The batch's records and bad records, as aggregate columns of the parsed records."""
    from pyspark.sql import functions as F

    return [F.count(F.lit(1)).alias("records"), F.count("_eo_error").alias("bad")]


def count_records(parsed: DataFrame) -> tuple[int, int]:
    """``(records, bad records)`` of the parsed records, in a Spark job of its own."""
    row = parsed.agg(*record_counts()).collect()[0]
    return int(row["records"]), int(row["bad"])


def observed_counts(observation: Any) -> tuple[int, int] | None:
    """``(records, bad)`` observed by the job that just wrote a plan's output (:attr:`WritePlan.observation`), or
    None when that job did not run the observed records (a transform that ignored its input)."""
    if observation is None:
        return None
    from pyspark.errors import PySparkAssertionError

    java = getattr(observation, "_jo", None)
    if java is not None:
        # Classic: Observation.get waits, forever, for a job that ran the observed plan. Spark 4.0 completes it
        # before the job's action returns; a grace period covers a late listener, then we count instead of hanging.
        deadline = time.monotonic() + 10
        while not java.future().isCompleted():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
    try:
        metrics = observation.get  # Spark Connect: set by the action's response, else an error
    except PySparkAssertionError:
        return None
    if "records" not in metrics or "bad" not in metrics:
        # Spark Connect answers a write command (to_driver's noop write) without the observed metrics: not counted.
        return None
    return int(metrics["records"]), int(metrics["bad"])
