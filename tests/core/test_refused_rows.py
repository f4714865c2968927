"""Finding the rows a table refuses by probing slices and halves (core/refused_rows.py), against a table faked as
the set of row indexes it refuses."""

from __future__ import annotations

import pytest

from airflow_eo.core.refused_rows import RefusedRow, TooManyRefused, isolate_refused, refusal_text


def probing(refused: set[int], calls: list[tuple[int, int]] | None = None):
    def probe(lo: int, hi: int) -> str | None:
        if calls is not None:
            calls.append((lo, hi))
        bad = sorted(i for i in refused if lo <= i < hi)
        return f"row {bad[0]} refused" if bad else None
    return probe


@pytest.mark.parametrize("refused", [set(), {0}, {9_999}, {5, 6, 7}, {0, 4_095, 4_096, 9_999}, set(range(0, 300, 7))])
def test_every_refused_row_is_found_alone_in_index_order(refused):
    assert isolate_refused(10_000, probing(refused)) == [RefusedRow(i, f"row {i} refused") for i in sorted(refused)]


def test_the_probes_cost_a_pass_over_the_rows_and_a_few_per_refused_row():
    calls: list[tuple[int, int]] = []
    isolate_refused(100_000, probing({12_345}, calls))
    assert sum(hi - lo for lo, hi in calls) < 100_000 + 2 * 4_096
    assert len(calls) <= 100_000 // 4_096 + 1 + 2 * 12


def test_rows_refused_only_together_yield_none():
    def together(lo: int, hi: int) -> str | None:
        return "duplicate unique value" if lo <= 1 and hi >= 3 else None  # rows 1 and 2 together
    assert isolate_refused(4, together, first_slice=4) == []


def test_more_refused_rows_than_the_limit_stop_the_search_with_those_found():
    with pytest.raises(TooManyRefused) as raised:
        isolate_refused(1_000, probing(set(range(100))), limit=10)
    assert [row.index for row in raised.value.found] == list(range(11))


def test_the_probes_row_number_is_not_in_the_text():
    assert refusal_text("Out of range value for column 'n' at row 3 (MySQL error 1264)") == \
        "Out of range value for column 'n' (MySQL error 1264)"
