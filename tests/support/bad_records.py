"""Bad records for the dead-letter tests: values that fail to parse, their Kafka headers, the check that a dead letter
kept them, a batch whose dead letters go through the driver, and an older release's dead-letter table."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable
from typing import Any

from airflow_eo.core.batch import BatchSummary
from airflow_eo.core.config import BadRecordPolicy, ParseConfig
from airflow_eo.core.headers import decode_headers
from airflow_eo.core.protocol import run_batch
from examples.page_views import SCHEMA
from tests.support.operator_harness import adapters, request

BAD_VALUES = [
    b"{not json",
    json.dumps({"event_id": None, "app_id": "app_x", "user_id": "u", "ts": "2026-01-01T00:00:00Z"}).encode(),
    json.dumps({"event_id": "e-bad-type", "app_id": "app_x", "ts": "yesterday"}).encode(),
]
#: The Kafka headers of each of BAD_VALUES: several, a duplicate key, a null and an empty value, bytes that are not
#: UTF-8, a non-ASCII key; and none at all.
BAD_HEADERS: list[list[tuple[str, bytes | None]]] = [
    [("source", b"app_x"), ("trace", b"\x00\xff\xfe\x80"), ("source", b"retry"), ("gone", None), ("empty", b"")],
    [("cl\u00e9", "\u00e9t\u00e9 \U0001f600".encode()), ("all_bytes", bytes(range(256)))],
    [],
]


def assert_headers_kept(dead: Iterable[tuple[Any, Any]]) -> None:
    """Each dead letter's (raw_value, kafka_headers) holds its record's headers byte for byte, in order."""
    expected = {value: tuple(headers) for value, headers in zip(BAD_VALUES, BAD_HEADERS, strict=True)}
    found = [(bytes(value), headers) for value, headers in dead]
    assert found and all(decode_headers(h) == expected[v] for v, h in found), found
    assert all(h == "[]" for v, h in found if v == BAD_VALUES[2]), found  # no headers: an empty list, not NULL


class DriverDeadLetters:
    """A sink without its executor-side dead-letter writer (``dead_letter_writer``): the engine streams the bad
    records through the driver into its ``write_dead_letters``, as for any sink that has none."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    @property
    def capabilities(self) -> Any:
        # A kind that keeps dead letters has the executors' writer (core/abilities.py, DeadLetterTable): this one's
        # capabilities say it has none, so the engine asks no writer of it.
        return dataclasses.replace(self._sink.capabilities, dead_letters=False)

    def __getattr__(self, name: str) -> Any:
        if name == "dead_letter_writer":
            raise AttributeError(name)
        return getattr(self._sink, name)


def run_with_driver_dead_letters(spec: Any, pipeline: str, topic: str) -> BatchSummary:
    """One batch of ``spec``'s sink under ``on_bad_record="dead_letter"``, its dead letters through the driver."""
    roles = adapters(spec, pipeline, parse=ParseConfig(schema=SCHEMA, on_bad_record=BadRecordPolicy.DEAD_LETTER))
    roles["sink"] = DriverDeadLetters(roles["sink"])
    return run_batch(request(pipeline, topic, f"manual__{uuid.uuid4().hex}"), **roles)


#: A MySQL dead-letter table as releases before ``kafka_headers`` made it (``dead_letter_ddl`` before f8c030a): in
#: the server's default character set and collation (latin1_swedish_ci on the stack's MariaDB: case-insensitive).
V1_DEAD_LETTER_DDL = (
    "CREATE TABLE {name} (pipeline_id VARCHAR(190) NOT NULL, topic VARCHAR(249) NOT NULL, kafka_partition INT NOT "
    "NULL, kafka_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, record_key LONGBLOB NULL, raw_value LONGBLOB NULL, "
    "error TEXT NOT NULL, created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), "
    "PRIMARY KEY (pipeline_id, topic, kafka_partition, kafka_offset)) ENGINE=InnoDB")
