"""Finding the rows a table refuses by probing slices and halves (core/refused_rows.py), against a table faked as
the set of row indexes it refuses."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from airflow_eo.core.refused_rows import RefusedRow, isolate_refused, refusal_text


def probing(refused: set[int], calls: list[Sequence[int]] | None = None, unique: dict[int, str] | None = None):
    """A table refusing the rows ``refused`` alone, and a row whose ``unique`` value an earlier row of the same
    probe has."""
    def probe(rows: Sequence[int]) -> str | None:
        if calls is not None:
            calls.append(rows)
        bad = sorted(i for i in rows if i in refused)
        if bad:
            return f"row {bad[0]} refused"
        seen: set[str] = set()
        for i in rows:
            value = (unique or {}).get(i)
            if value in seen:
                return f"duplicate {value}"
            if value is not None:
                seen.add(value)
        return None
    return probe


@pytest.mark.parametrize("refused", [set(), {0}, {9_999}, {5, 6, 7}, {0, 4_095, 4_096, 9_999}, set(range(0, 300, 7))])
def test_every_refused_row_is_found_alone_in_index_order(refused):
    assert isolate_refused(10_000, probing(refused)) == (
        [RefusedRow(i, f"row {i} refused") for i in sorted(refused)], False)


def test_the_probes_cost_two_passes_over_the_rows_and_a_few_per_refused_row():
    calls: list[Sequence[int]] = []
    isolate_refused(100_000, probing({12_345}, calls))
    # the slices and halves, then one probe of the rows left (none refused with an earlier one)
    assert sum(len(rows) for rows in calls) < 2 * 100_000 + 2 * 4_096
    assert len(calls) <= 100_000 // 4_096 + 1 + 2 * 12 + 1


@pytest.mark.parametrize("pairs", [[(1, 2)], [(0, 9_999)], [(10, 5_000), (11, 12), (4_095, 4_096)],
                                   [(3, 7), (3, 8)]])
def test_of_rows_sharing_a_unique_value_the_later_ones_are_refused(pairs):
    """Two records of one value of a unique index other than the key: each passes alone, so the halves find
    neither; the later is refused (as the database refuses the later of two inserts), the earlier written."""
    unique = {}
    for n, (first, later) in enumerate(pairs):
        unique[first] = unique.get(first, f"v{n}")
        unique[later] = unique[first]
    expected = sorted({later for _, later in pairs})
    found, past_limit = isolate_refused(10_000, probing({6, 9_000}, unique=unique))
    assert [row.index for row in found] == sorted([6, 9_000, *expected]) and not past_limit
    for row in found:
        if row.index in expected:
            assert row.error == f"duplicate {unique[row.index]} (with an earlier record of the batch)"


def test_a_pair_costs_about_log2_probes_of_the_rows():
    calls: list[Sequence[int]] = []
    isolate_refused(100_000, probing(set(), calls, unique={70_000: "x", 90_000: "x"}))
    assert len(calls) <= 100_000 // 4_096 + 1 + 1 + 17 + 1


def test_past_the_limit_the_slices_still_refused_are_refused_whole():
    """A producer sending more refused records than one task isolates one by one does not hold the batch: the first
    ``limit`` are found alone, then each slice the table still refuses is refused whole (good rows with them)."""
    found, past_limit = isolate_refused(1_000, probing(set(range(100))), limit=10)
    indexes = [row.index for row in found]
    assert past_limit and set(range(100)) <= set(indexes) <= set(range(128)) and indexes == sorted(indexes)
    assert [row.error for row in found[:10]] == [f"row {i} refused" for i in range(10)]
    assert all("not searched one by one: more than 10 records of this write task refused" in row.error
               for row in found[10:])


def test_rows_refused_after_earlier_ones_count_toward_the_limit():
    unique = {i: f"v{i % 5}" for i in range(50)} | {i: f"w{i}" for i in range(50, 60)}  # 5..49 repeat a value
    found, past_limit = isolate_refused(60, probing({0}, unique=unique), limit=10)
    # row 0 refused alone, so row 5 is the first v0 written; 6..14 found one by one; from 15 on, as a set
    assert past_limit and [row.index for row in found] == [0, *range(6, 60)]
    assert found[9].error == "duplicate v4 (with an earlier record of the batch)"
    assert "not searched one by one" in found[10].error


def test_the_probes_row_number_is_not_in_the_text():
    assert refusal_text("Out of range value for column 'n' at row 3 (MySQL error 1264)") == \
        "Out of range value for column 'n' (MySQL error 1264)"
