"""Change streams' decisions (``core/changes.py``): positions in source order, the newest change per key, and the
pipelines that may read changes."""

from __future__ import annotations

import json

import pytest

from airflow_eo.core.changes import (
    Change,
    ChangeFormat,
    check_changes,
    mysql_position,
    newer,
    position_partition,
    postgres_position,
    winners,
)
from airflow_eo.core.dedup import seen_id_partition
from airflow_eo.core.errors import ConfigurationError


def pg(op: str, last_commit: int | None, lsn: int) -> bytes:
    return postgres_position(op, lsn, json.dumps([None if last_commit is None else str(last_commit), str(lsn)]))


def test_postgres_positions_follow_commit_order_not_lsn_order():
    # Transaction a (changes at LSN 3, 5) commits after b (changes at 4, 6): Debezium emits b's changes first, each
    # carrying the commit LSN of the transaction before its own.
    b_first, b_second = pg("c", 100, 4), pg("u", 100, 6)
    a_first, a_second = pg("c", 109, 3), pg("u", 109, 5)  # sequence[0]: the commit before a's own, b's (109)
    assert b_first < b_second < a_first < a_second


def test_a_snapshot_read_comes_after_every_change_committed_before_it_and_before_those_after():
    snapshot = pg("r", None, 250)  # as Debezium 3.6 records a snapshot's reads: no last commit, the slot's LSN
    assert snapshot == (250).to_bytes(8, "big") + bytes(8)
    assert pg("u", 150, 180) < pg("u", 200, 240) < snapshot  # changes the snapshot reflects
    assert snapshot < pg("u", 260, 270)  # a change committed after it
    # A re-snapshot by a connector registered afresh (a new slot, a later LSN) repairs a row whose change was never
    # streamed: its read is newer than every change streamed before.
    assert pg("r", None, 900) > pg("u", 800, 850)


def test_the_first_transaction_streamed_without_a_last_commit_comes_after_earlier_changes_of_its_rows():
    # Recorded from Debezium 3.6: the snapshot's reads and the first transaction after them have no last commit.
    snapshot, first = pg("r", None, 27048824), pg("c", None, 27048864)
    assert snapshot < first < pg("u", 27049048, 27049048)
    # After a restart the first transaction has none either; a row it changes was last changed before its begin.
    earlier = pg("u", 500, 480)  # began before the commit that ended at 500, changed the row at 480, committed at 520
    assert pg("u", None, 530) > earlier
    assert postgres_position("c", 42, None) == (42).to_bytes(8, "big") * 2


def test_mysql_positions_order_by_file_then_position_then_row():
    assert mysql_position("c", "mysql-bin.000002", 10, 0) > mysql_position("c", "mysql-bin.000001", 99999, 7)
    assert mysql_position("u", "mysql-bin.000001", 500, 1) > mysql_position("u", "mysql-bin.000001", 500, 0)
    assert mysql_position("r", "mysql-bin.000001", 500, 0) < mysql_position("c", "mysql-bin.000001", 500, 0)


def test_equal_is_not_newer_so_a_re_sent_change_is_a_no_op():
    assert newer(b"\x02", b"\x01") and newer(b"\x01", None)
    assert not newer(b"\x01", b"\x01") and not newer(b"\x01", b"\x02")


def test_per_key_the_newest_change_applies_only_over_an_older_row():
    changes = [Change((1,), b"\x05", "u"), Change((1,), b"\x03", "c"), Change((2,), b"\x04", "d"),
               Change((3,), b"\x01", "c")]
    applied = {(2,): b"\x09", (3,): b"\x00"}
    assert winners(changes, applied) == {(1,): Change((1,), b"\x05", "u"), (3,): Change((3,), b"\x01", "c")}


def test_the_position_writers_branches_are_numbered_apart_from_every_other_writers():
    numbers = {p: position_partition(p) for p in range(4)}
    taken = {*range(4), -1, *(-2 - p for p in range(4)), *(seen_id_partition(p) for p in range(4))}
    assert not set(numbers.values()) & taken


CHECKED = dict(sink_name="MySqlUpsertSink", takes_changes=True, key_columns=("id",), accumulating=False,
               interval_mode=False, dedup_key=())


def test_changes_are_read_by_a_sink_that_applies_them_by_key():
    assert check_changes(None, **CHECKED) is None
    assert check_changes("debezium", **CHECKED) is ChangeFormat.DEBEZIUM


@pytest.mark.parametrize(("override", "said"), [
    ({"takes_changes": False}, "which this sink does not do"),
    ({"key_columns": ()}, "needs key_columns"),
    ({"accumulating": True}, "'add' updates"),
    ({"interval_mode": True}, "mode='continuous'"),
    ({"dedup_key": ("id",)}, "drop dedup_key"),
])
def test_what_cannot_apply_changes_is_refused_with_the_reason(override, said):
    with pytest.raises(ConfigurationError, match=said):
        check_changes("debezium", **{**CHECKED, **override})


def test_an_unknown_change_format_names_the_known_ones():
    with pytest.raises(ConfigurationError, match="choose one of debezium"):
        check_changes("maxwell", **CHECKED)


def test_on_truncate_is_checked_when_the_dag_is_parsed():
    assert check_changes("debezium", **CHECKED, on_truncate="truncate", truncates=True) is ChangeFormat.DEBEZIUM
    with pytest.raises(ConfigurationError, match="not yet for the table formats"):
        check_changes("debezium", **{**CHECKED, "sink_name": "DeltaTableSink"}, on_truncate="truncate",
                      truncates=False)
    with pytest.raises(ConfigurationError, match="on_truncate is for change streams"):
        check_changes(None, **CHECKED, on_truncate="truncate", truncates=True)
    with pytest.raises(ConfigurationError, match="choose one of fail, truncate"):
        check_changes("debezium", **CHECKED, on_truncate="empty", truncates=True)


def _envelope(**fields: object) -> str:
    value = {"type": "record", "name": "Value", "fields": [{"name": "id", "type": "int"}]}
    source = {"type": "record", "name": "Source", "fields": [{"name": "lsn", "type": ["null", "long"]}]}
    chosen = {"before": ["null", value], "after": ["null", "Value"], "source": source, "op": "string", **fields}
    return json.dumps({"type": "record", "name": "Envelope",
                       "fields": [{"name": n, "type": t} for n, t in chosen.items() if t is not None]})


def test_an_avro_envelope_is_debeziums_or_refused_saying_what_it_lacks():
    from airflow_eo.core.changes import check_avro_envelope

    check_avro_envelope(_envelope())  # `after` naming the record `before` defined, as Debezium's converter writes it
    mysql_source = {"type": "record", "name": "Source", "fields": [{"name": "file", "type": "string"},
                                                                   {"name": "pos", "type": "long"}]}
    check_avro_envelope(_envelope(source=mysql_source))
    for fields, said in [({"op": None, "after": None}, "it has no 'after', 'op'"),
                         ({"op": "int"}, "'op' is 'int', not a string"),
                         ({"after": ["null", "string"]}, "'after' is not a record"),
                         ({"source": {"type": "record", "name": "S", "fields": [{"name": "file", "type": "string"}]}},
                          "'source' is no Debezium source block with a position")]:
        with pytest.raises(ConfigurationError, match=said):
            check_avro_envelope(_envelope(**fields))
