import json

import pytest

from airflow_eo.core.batch_states import BatchState, can_transition
from airflow_eo.core.ranges import OffsetRange, check_contiguous, ranges_from_json, ranges_to_json, spark_offsets
from airflow_eo.core.xid import FORMAT_ID, Xid, parse_recover_row, pipeline_key


def test_ranges_round_trip_through_json():
    ranges = [OffsetRange("b", 1, 3, 9), OffsetRange("a", 0, 0, 0)]
    assert ranges_from_json(ranges_to_json(ranges)) == sorted(ranges)


def test_invalid_range_is_refused():
    with pytest.raises(ValueError):
        OffsetRange("t", 0, 5, 4)


def test_spark_offsets_skip_empty_ranges():
    starting, ending = spark_offsets([OffsetRange("t", 0, 3, 9), OffsetRange("t", 1, 4, 4)])
    assert json.loads(starting) == {"t": {"0": 3}}
    assert json.loads(ending) == {"t": {"0": 9}}


def test_contiguity_is_checked():
    check_contiguous({("t", 0): 3}, [OffsetRange("t", 0, 3, 5)])
    with pytest.raises(AssertionError, match="not at its committed offset 3"):
        check_contiguous({("t", 0): 3}, [OffsetRange("t", 0, 4, 5)])
    # A gap skipped on purpose (lost to retention) belongs to the batch.
    check_contiguous({("t", 0): 3}, [OffsetRange("t", 0, 8, 9)], [OffsetRange("t", 0, 3, 8)])


@pytest.mark.parametrize(("source", "target", "allowed"), [
    (BatchState.PLANNED, BatchState.PREPARED, True),
    (BatchState.PLANNED, BatchState.COMMITTED, True),
    (BatchState.PREPARED, BatchState.COMMITTED, True),
    (BatchState.PREPARED, BatchState.ABORTED, True),
    (BatchState.COMMITTED, BatchState.ABORTED, False),
    (BatchState.COMMITTED, BatchState.COMMITTED, False),
    (BatchState.ABORTED, BatchState.COMMITTED, False),
])
def test_state_transitions(source, target, allowed):
    assert can_transition(source, target) is allowed


def test_xid_round_trips_and_fits_xa_limits():
    xid = Xid(pipeline_key("a" * 500), 123456789, 42, 7, 3, 99)
    assert Xid.decode(xid.encode()) == xid
    assert len(xid.gtrid) <= 64 and len(xid.bqual) <= 64
    data = xid.gtrid + xid.bqual
    assert parse_recover_row(FORMAT_ID, len(xid.gtrid), len(xid.bqual), data) == xid


def test_xid_of_another_format_or_shape_is_not_ours():
    assert parse_recover_row(1, 3, 3, b"abcdef") is None
    assert parse_recover_row(FORMAT_ID, 3, 3, b"abcdef") is None


def test_xid_sql_uses_hex_literals():
    xid = Xid("k", 1, 2, 3)
    assert xid.sql() == f"X'{xid.gtrid.hex()}',X'{xid.bqual.hex()}',{FORMAT_ID}"


def test_pipeline_key_is_stable_160_bits_and_fits_the_gtrid_with_any_batch_id():
    assert pipeline_key("p") == pipeline_key("p") != pipeline_key("q")
    assert len(pipeline_key("x" * 1000)) == 40
    biggest = Xid(pipeline_key("x" * 1000), 2**63 - 1, 2**31, 10**6, 10**6, 10**6)
    assert len(biggest.gtrid) <= 64 and Xid.decode(biggest.encode()) == biggest


def test_a_branch_prepared_with_the_pre_upgrade_48_bit_key_still_belongs_to_its_pipeline():
    legacy = Xid(pipeline_key("p")[:12], 1, 1, 0)
    assert legacy.belongs_to("p") and not legacy.belongs_to("q")
    assert Xid(pipeline_key("p"), 1, 1, 0).belongs_to("p") and not Xid(pipeline_key("q"), 1, 1, 0).belongs_to("p")
