"""Output columns the target table lacks: refused with the ``ALTER TABLE`` to run, or added (``add_missing_columns``)
before the write (driver side; :mod:`airflow_eo.core.columns` has the rule)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from airflow_eo.core.columns import add_column_statements, missing_columns
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.postgres.connection import connect
from airflow_eo.postgres.sql import add_column_statement, column_type

log = logging.getLogger(__name__)


def add_new_columns(name: str, connect_kwargs: Mapping[str, Any], table: str, table_columns: Sequence[str],
                    output: Sequence[tuple[str, str]], add: bool) -> list[str]:
    """The columns added to ``table`` (none when the output has no new one); raises, before any side effect, when
    there are new ones and ``add`` is False. Idempotent: a column another attempt added meanwhile is taken as it is."""
    missing = missing_columns(output, table_columns)
    if not missing:
        return []
    statements = add_column_statements(name, table, missing, column_type,
                                       functools.partial(add_column_statement, table), add, table_columns)
    conn = connect(connect_kwargs, autocommit=True)
    try:
        for statement in statements:  # ADD COLUMN IF NOT EXISTS: a column added by an earlier attempt stays
            try:
                conn.execute(statement)
            except psycopg.Error as exc:
                raise ConfigurationError(f"{name}: cannot add a column to {table!r} ({str(exc).strip()}); run it "
                                         f"as the table's owner: {statement}") from exc
    finally:
        conn.close()
    log.info("%s: added column(s) %s to %s", name, ", ".join(c for c, _ in missing), table)
    return [c for c, _ in missing]
