"""What differs between the SQL databases the offset store runs on: a handful of statements' spellings (each
database's folder declares its own :class:`StoreDialect`, in its descriptor).

Everything else (the tables' columns, the fenced writes, the compare-and-set commit point, the reads, the audited
rewind) is one SQL text with ``%s`` placeholders, which every room's driver takes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoreDialect:
    """The spellings of one database.

    :param name: what error messages call the database.
    :param insert_ignore: ``INSERT`` that skips a row whose key exists: ``{table}``, ``{columns}``, ``{values}``
        and ``{key}`` (the conflict target) are filled in.
    :param increment_on_conflict: the tail of an ``INSERT`` that instead adds one to ``epoch`` of the existing
        row and sets ``taken_at`` (``{table}``, ``{key}`` and ``{now}`` are filled in).
    :param share_lock: the clause that locks a read row against writers only.
    :param utc_session: the statement that makes this transaction's timestamps read as UTC.
    :param identifier_quote: the character that quotes identifiers.
    :param exclusive_lock: the clause that locks a read row against readers that lock and writers.
    :param limit: the clause that keeps the first ``{n}`` rows.
    :param now: the current time to the millisecond, as the store's timestamp columns take it.
    """

    name: str
    insert_ignore: str
    increment_on_conflict: str
    share_lock: str
    utc_session: str
    identifier_quote: str
    exclusive_lock: str = "FOR UPDATE"
    limit: str = "LIMIT {n}"
    now: str = "CURRENT_TIMESTAMP(3)"

    def insert_ignoring(self, table: str, columns: tuple[str, ...], key: tuple[str, ...],
                        values: tuple[str, ...] | None = None) -> str:
        """``INSERT INTO table (columns) VALUES (...)`` that does nothing when a row with that key exists."""
        return self.insert_ignore.format(table=table, columns=", ".join(columns), key=", ".join(key),
                                         values=", ".join(values or ["%s"] * len(columns)))

    def insert_or_increment(self, table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
        """``INSERT`` of a row with ``epoch`` 1, or ``epoch + 1`` (and ``taken_at`` now) of the existing one."""
        placeholders = ", ".join(["%s"] * (len(columns) - 1) + ["1"])
        return (f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders}) "
                + self.increment_on_conflict.format(table=table, key=", ".join(key), now=self.now))

    def qualifier(self, schema: str | None) -> str:
        """``"schema".`` (quoted, validated by the caller) to qualify the store's tables, or nothing."""
        q = self.identifier_quote
        return f"{q}{schema}{q}." if schema else ""

