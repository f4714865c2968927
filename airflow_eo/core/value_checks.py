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
    CHARSET = "charset"  # no character the column's character set lacks (``pattern`` finds one)


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
    #: the text column's character set where the database has one per column (MySQL's ``latin1``, ``utf8mb4`` ..)
    charset: str | None = None


@dataclass(frozen=True)
class ValueRule:
    """One value check: ``column``'s value must pass ``check``; ``message`` says why a value that fails is refused."""

    column: str
    check: Check
    message: str
    limit: int = 0
    low: int = 0
    #: a Java regular expression that finds a refused character (``Check.CHARSET``)
    pattern: str = ""


#: The integers each integer type holds (signed; unsigned ones: 0 to twice the maximum + 1).
INTEGER_BITS = {"tinyint": 8, "smallint": 16, "int2": 16, "mediumint": 24, "int": 32, "integer": 32, "int4": 32,
                "bigint": 64, "int8": 64}

#: MySQL's character sets whose bytes are UTF-8's (a TEXT column's limit counts these bytes).
UTF8_CHARSETS = frozenset({"utf8mb4", "utf8mb3", "utf8"})
#: MySQL's character sets of one byte per character (a TEXT column's limit counts characters).
SINGLE_BYTE_CHARSETS = frozenset({"latin1", "ascii"})
#: What a character set cannot store, as a Java regular expression that finds such a character. MySQL's latin1 is
#: Windows-1252, whose five unassigned bytes hold the C1 controls of the same number (checked on MariaDB 10.11:
#: U+0081 is stored, U+0080 refused); utf8mb3 lacks the characters beyond the Basic Multilingual Plane (emoji).
_CP1252_EXTRAS = "".join(rf"\x{{{c:04X}}}" for c in (
    0x20AC, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x017D, 0x2018,
    0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x017E, 0x0178, 0x81,
    0x8D, 0x8F, 0x90, 0x9D))
REFUSED_CHARACTERS = {
    "utf8mb3": r"[\x{10000}-\x{10FFFF}]",
    "utf8": r"[\x{10000}-\x{10FFFF}]",
    "ascii": r"[^\x{00}-\x{7F}]",
    "latin1": rf"[^\x{{00}}-\x{{7F}}\x{{A0}}-\x{{FF}}{_CP1252_EXTRAS}]",
}

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
            if column.max_bytes is not None and column.charset in UTF8_CHARSETS:
                rules.append(ValueRule(name, Check.BYTES, f"{where}: the value is longer than {column.max_bytes} "
                                       "bytes of UTF-8", limit=column.max_bytes))
            elif column.max_bytes is not None and column.charset in SINGLE_BYTE_CHARSETS:
                rules.append(ValueRule(name, Check.CHARS, f"{where}: the value is longer than {column.max_bytes} "
                                       "characters", limit=column.max_bytes))
            if column.charset in REFUSED_CHARACTERS:
                rules.append(ValueRule(name, Check.CHARSET, f"{where} in character set {column.charset}: the value "
                                       "holds a character that character set lacks",
                                       pattern=REFUSED_CHARACTERS[column.charset]))
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
