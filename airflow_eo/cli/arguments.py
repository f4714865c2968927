"""What ``airflow eo`` reads from its command line, checked before any call (no Airflow import)."""

from __future__ import annotations

import json

from airflow_eo.core.errors import OperationError
from airflow_eo.core.ranges import TopicPartition


def parse_offsets(text: str) -> dict[TopicPartition, int]:
    """``--to-offsets`` JSON, in the form of Spark's ``startingOffsets``: ``{"topic": {"0": 42, "1": 7}}``.

    :param text: the JSON text.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OperationError(f"--to-offsets is not JSON ({exc.msg}); use e.g. '{{\"page_views\": {{\"0\": 42}}}}'") \
            from None
    offsets: dict[TopicPartition, int] = {}
    if not isinstance(data, dict) or not data:
        raise OperationError('--to-offsets must be a JSON object {"topic": {"partition": offset, ...}, ...}')
    for topic, partitions in data.items():
        if not isinstance(partitions, dict) or not partitions:
            raise OperationError(f'--to-offsets: topic {topic!r} must map partitions to offsets: {{"0": 42}}')
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise OperationError(f"--to-offsets: {topic}[{partition}]={offset!r}: partitions and offsets must "
                                     "be non-negative integers")
            offsets[(str(topic), int(partition))] = offset
    return offsets
