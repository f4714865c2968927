"""What a MySQL target table is made of (``information_schema``, read by the sink's check before any write), and
whether replacing its rows whole (``LOAD DATA .. REPLACE``) is the same as the upsert."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_eo.core.config import UpdateMode


@dataclass(frozen=True)
class TableShape:
    """What a target table is made of, as its database reports it (read by the sink's check, before any write)."""

    #: every column the table stores that a write may set (generated columns are left out: the server computes them)
    columns: tuple[str, ...]
    #: the column sets of its PRIMARY KEY and UNIQUE indexes
    unique_keys: tuple[frozenset[str], ...]
    #: it has triggers (a replacing load deletes rows, which fires DELETE triggers an upsert never fires)
    has_triggers: bool = False
    #: another table's foreign key refers to it: a deleted row would cascade, or be refused
    referenced: bool = False
    #: the check's user cannot see every table, so one of those might refer to it (taken to: see ``referenced``)
    foreign_keys_hidden: bool = False
    #: a plain base table (not a view, not system-versioned: those keep or change history rows differently)
    plain: bool = True


def why_replace_is_not_upsert(shape: TableShape, columns: Sequence[str], key_columns: Sequence[str],
                              updates: Mapping[str, str]) -> str | None:
    """None when replacing each written row whole (MySQL's ``LOAD DATA .. REPLACE``: a row of an existing key is
    deleted, the new one inserted) leaves the table exactly as the upsert (``INSERT .. ON DUPLICATE KEY UPDATE`` of
    every written column) does, for any rows and any table contents; else why not, for the log.

    It does when the updates only overwrite, the write sets every column the table stores (nothing the old row had
    survives an upsert either), the key is the table's only unique key (a replace deletes every row that conflicts
    on any unique key; an upsert updates one), and deleting a row has no side effect (no trigger, no foreign key
    referring to the table, no history). Column names compare as MySQL compares them: without case.
    """
    added = sorted(c for c, mode in updates.items() if UpdateMode(mode) is UpdateMode.ADD)
    if added:
        return f"its updates add to column(s) {', '.join(added)}"
    written = {c.lower() for c in columns}
    stored = {c.lower() for c in shape.columns}
    if written - stored:
        return f"the output has column(s) the table does not store: {', '.join(sorted(written - stored))}"
    if stored - written:
        return f"the output leaves column(s) {', '.join(sorted(stored - written))} out, which an upsert keeps"
    keys = {frozenset(c.lower() for c in key) for key in shape.unique_keys}
    if keys != {frozenset(c.lower() for c in key_columns)}:
        return "the table has another unique key besides the upsert key"
    if shape.has_triggers:
        return "the table has triggers"
    if shape.referenced:
        return "a foreign key refers to the table"
    if shape.foreign_keys_hidden:
        return ("a foreign key may refer to the table from a table the check's user cannot see (on MariaDB, the "
                "PROCESS privilege lets the check read every foreign key from InnoDB's dictionary)")
    if not shape.plain:
        return "the table is not a plain base table"
    return None
