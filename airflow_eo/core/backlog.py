"""How many offsets a pipeline has not processed yet (its lag), per partition. Pure logic."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_eo.core.planning import PartitionOffsets, plan_batch
from airflow_eo.core.ranges import TopicPartition


def backlog(partitions: Sequence[PartitionOffsets], committed: Mapping[TopicPartition, int]) -> dict[str, int]:
    """Unprocessed offsets per ``"topic[partition]"``: last stable offset minus committed position.

    Offsets lost to retention are not counted (they cannot be processed); offsets are an
    upper bound of records (transaction markers take offsets too).
    """
    plan = plan_batch(partitions, committed, skip_lost_records=True)
    return {f"{r.topic}[{r.partition}]": r.size for r in plan.ranges}


def backlog_reached(lag: Mapping[str, int], min_records: int, per_partition: bool) -> bool:
    """``min_records`` reached in total, or (``per_partition``) in some single partition."""
    if per_partition:
        return any(n >= min_records for n in lag.values())
    return sum(lag.values()) >= min_records
