"""The value rules a table's catalog implies for an output (pure: :mod:`airflow_eo.core.value_checks`)."""

from __future__ import annotations

from airflow_eo.core.value_checks import Check, ColumnFacts, integer_range, value_rules

FACTS = [
    ColumnFacts("id", "varchar(16)", False, max_chars=16),
    ColumnFacts("note", "text", True, max_bytes=65535, charset="utf8mb4"),
    ColumnFacts("old", "text", True, max_bytes=65535, charset="latin1"),
    ColumnFacts("mb3", "varchar(8)", True, max_chars=8, charset="utf8mb3"),
    ColumnFacts("n", "integer", True, int_range=integer_range("integer")),
    ColumnFacts("big", "bigint", True, int_range=integer_range("bigint")),
    ColumnFacts("u", "int(10) unsigned", True, int_range=integer_range("int", unsigned=True)),
    ColumnFacts("flag", "boolean", False),
]


def test_strings_get_their_lengths_and_nul_only_where_the_database_refuses_it():
    rules = value_rules("t", FACTS, [("id", "string"), ("note", "string")], refuses_nul=True)
    assert [(r.column, r.check, r.limit) for r in rules] == [
        ("id", Check.NOT_NULL, 0), ("id", Check.CHARS, 16), ("id", Check.NUL, 0),
        ("note", Check.BYTES, 65535), ("note", Check.NUL, 0)]
    assert "column 'id' of table t is varchar(16)" in rules[1].message and "16 characters" in rules[1].message
    assert all(r.check is not Check.NUL for r in value_rules("t", FACTS, [("id", "string")], refuses_nul=False))


def test_integers_get_a_range_only_where_the_column_is_narrower_than_the_output():
    rules = value_rules("t", FACTS, [("n", "bigint"), ("big", "bigint"), ("u", "int"), ("n", "int")],
                        refuses_nul=False)
    assert [(r.column, r.low, r.limit) for r in rules] == [("n", -2**31, 2**31 - 1), ("u", 0, 2**32 - 1)]
    assert "outside 0 .. 4294967295" in rules[1].message


def test_not_null_columns_and_unknown_ones():
    rules = value_rules("t", FACTS, [("flag", "boolean"), ("added", "string")], refuses_nul=True)
    assert [(r.column, r.check) for r in rules] == [("flag", Check.NOT_NULL)]
    assert integer_range("text") is None and integer_range("SMALLINT") == (-32768, 32767)


def test_a_mysql_columns_character_set_counts_its_bytes_and_refuses_what_it_lacks():
    rules = value_rules("t", FACTS, [("old", "string"), ("mb3", "string")], refuses_nul=False)
    assert [(r.column, r.check, r.limit) for r in rules] == [
        ("old", Check.CHARS, 65535), ("old", Check.CHARSET, 0), ("mb3", Check.CHARS, 8), ("mb3", Check.CHARSET, 0)]
    assert rules[1].pattern.startswith(r"[^\x{00}-\x{7F}\x{A0}-\x{FF}\x{20AC}") and r"\x{009D}]" in rules[1].pattern
    assert rules[3].pattern == r"[\x{10000}-\x{10FFFF}]" and "character set utf8mb3" in rules[3].message
