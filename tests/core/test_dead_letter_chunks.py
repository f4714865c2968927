"""Dead letters streamed through the driver are chunked by count and by bytes (issue 23, item 9)."""

from __future__ import annotations

from airflow_eo.core.batch import DEAD_LETTER_FIELDS, DeadLetter, dead_letter_chunks
from airflow_eo.core.headers import encode_headers


def letters(n: int, value_bytes: int) -> list[DeadLetter]:
    return [DeadLetter("t", 0, i, b"k", b"v" * value_bytes, "bad") for i in range(n)]


def test_a_few_huge_bad_records_make_small_chunks_and_many_small_ones_are_cut_by_count():
    huge = list(dead_letter_chunks(letters(10, 4 * 1024 * 1024), "p", 7, max_records=10_000,
                                   max_bytes=32 * 1024 * 1024))
    # 8 records of 4 MiB reach 32 MiB: the driver never holds more than that (plus one record) of them.
    assert [len(c) for c in huge] == [8, 2]
    small = list(dead_letter_chunks(letters(25_001, 10), "p", 7))
    assert [len(c) for c in small] == [10_000, 10_000, 5_001]
    one = list(dead_letter_chunks(letters(1, 64 * 1024 * 1024), "p", 7))
    assert [len(c) for c in one] == [1]  # a record bigger than the bound still goes, alone


def test_chunks_carry_every_field_in_order_and_lose_nothing():
    headers = (("h", b"\xff"), ("h", None))
    records = letters(3, 1) + [DeadLetter("t", 2, 9, None, None, "null value", headers)]
    rows = [row for chunk in dead_letter_chunks(records, "pipe", 4, max_records=2) for row in chunk]
    assert [tuple(row) for row in rows] == [DEAD_LETTER_FIELDS] * 4
    assert [(r["kafka_partition"], r["kafka_offset"], r["record_key"], r["raw_value"]) for r in rows] == [
        (0, 0, b"k", b"v"), (0, 1, b"k", b"v"), (0, 2, b"k", b"v"), (2, 9, None, None)]
    assert [r["kafka_headers"] for r in rows] == ["[]"] * 3 + [encode_headers(headers)]
    assert {(r["pipeline_id"], r["batch_id"]) for r in rows} == {("pipe", 4)}
