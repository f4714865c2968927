"""Values a sink's table refuses, known before the write: the rules a record's output row must pass, decided from the
table's catalog (read once, in the sink's ``check()``) and the output's column types.

A record that breaks one is a bad record like a malformed one (``on_bad_record`` decides: the batch fails naming
it, or it becomes a dead letter), found where the records are parsed instead of by a failed ``COPY`` or
``INSERT`` that would fail every run of the batch. What a catalog cannot tell (a ``CHECK`` or foreign-key
constraint, a trigger) is not checked here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Check(Enum):
    """What a rule tests of one value."""

    CHARS = "chars"  # at most ``limit`` characters (CHAR(n), VARCHAR(n))
    BYTES = "bytes"  # at most ``limit`` bytes of UTF-8 (MySQL's TEXT types count bytes)
    NUL = "nul"  # no NUL character (PostgreSQL's text types refuse it)
    RANGE = "range"  # an integer from ``low`` to ``limit`` (a narrower integer column than the output's)
    NOT_NULL = "not_null"  # a value (a NOT NULL column)


@dataclass(frozen=True)
class ColumnFacts:
    """What a table's catalog says of one column."""

    name: str
    #: the column's type as the catalog prints it (for messages): ``varchar(16)``, ``int(10) unsigned``, ``integer``
    sql_type: str
    nullable: bool
    max_chars: int | None = None
    max_bytes: int | None = None
    #: the integers the column holds (an integer column)
    int_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class ValueRule:
    """One value check: ``column``'s value must pass ``check``; ``message`` says why a value that fails is refused."""

    column: str
    check: Check
    message: str
    limit: int = 0
    low: int = 0


#: The integers each integer type holds (signed; unsigned ones: 0 to twice the maximum + 1).
INTEGER_BITS = {"tinyint": 8, "smallint": 16, "int2": 16, "mediumint": 24, "int": 32, "integer": 32, "int4": 32,
                "bigint": 64, "int8": 64}

#: Spark's integer types (``simpleString``) and their bits.
_SPARK_INTEGER_BITS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}


def integer_range(type_name: str, unsigned: bool = False) -> tuple[int, int] | None:
    """The integers a column of ``type_name`` (``int``, ``smallint`` ..) holds; None for another type."""
    bits = INTEGER_BITS.get(type_name.lower())
    if bits is None:
        return None
    return (0, 2 ** bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def value_rules(table: str, facts: Sequence[ColumnFacts], output: Sequence[tuple[str, str]],
                refuses_nul: bool) -> list[ValueRule]:
    """The rules of the ``output`` columns (name, Spark type) that ``table``'s columns (``facts``) need: length and
    NUL rules for strings, ranges for integers wider in the output than in the table, and NOT NULL."""
    by_name = {f.name: f for f in facts}
    rules: list[ValueRule] = []
    for name, spark_type in output:
        column = by_name.get(name)
        if column is None:
            continue  # a column the sink adds, or its own (tombstones)
        where = f"column {name!r} of table {table} is {column.sql_type}"
        if not column.nullable:
            rules.append(ValueRule(name, Check.NOT_NULL, f"{where} NOT NULL: the record has no value for it"))
        if spark_type == "string":
            if column.max_chars is not None:
                rules.append(ValueRule(name, Check.CHARS, f"{where}: the value is longer than {column.max_chars} "
                                       "characters", limit=column.max_chars))
            if column.max_bytes is not None:
                rules.append(ValueRule(name, Check.BYTES, f"{where}: the value is longer than {column.max_bytes} "
                                       "bytes of UTF-8", limit=column.max_bytes))
            if refuses_nul:
                rules.append(ValueRule(name, Check.NUL, f"{where}: the value holds a NUL character (\\u0000), "
                                       "which the database cannot store in text"))
        bits = _SPARK_INTEGER_BITS.get(spark_type)
        if bits is not None and column.int_range is not None:
            low, high = column.int_range
            if low > -(2 ** (bits - 1)) or high < 2 ** (bits - 1) - 1:
                rules.append(ValueRule(name, Check.RANGE, f"{where}: the value is outside {low} .. {high}",
                                       limit=high, low=low))
    return rules
