"""Output columns the target table lacks: refused with the ``ALTER TABLE`` to run, or added (``add_missing_columns``)
before the write (driver side; :mod:`airflow_eo.core.columns` has the rule)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_eo.core.columns import add_column_statements, missing_columns
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.sqlsink.database import SqlDatabase

log = logging.getLogger(__name__)


def add_new_columns(database: SqlDatabase, name: str, connect_kwargs: Mapping[str, Any], table: str,
                    table_columns: Sequence[str], output: Sequence[tuple[str, str]], add: bool) -> list[str]:
    """The columns added to ``table`` (none when the output has no new one); raises, before any side effect, when
    there are new ones and ``add`` is False. Idempotent: a column another attempt added meanwhile is taken as it is."""
    missing = missing_columns(output, table_columns)
    if not missing:
        return []
    statements = add_column_statements(name, table, missing, database.column_type,
                                       functools.partial(database.add_column_statement, table), add, table_columns)
    conn = database.connect(connect_kwargs, autocommit=True)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                try:
                    cur.execute(statement)
                except database.errors() as exc:
                    if database.is_duplicate_column(exc):
                        continue  # added by an earlier attempt
                    raise ConfigurationError(f"{name}: cannot add a column to {table!r} ({database.describe(exc)}); "
                                             f"run it as {database.alter_role}: {statement}") from exc
    finally:
        conn.close()
    log.info("%s: added column(s) %s to %s", name, ", ".join(c for c, _ in missing), table)
    return [c for c, _ in missing]
