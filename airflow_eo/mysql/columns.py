"""Output columns the target table lacks: refused with the ``ALTER TABLE`` to run, or added (``add_missing_columns``)
before the write (driver side; :mod:`airflow_eo.core.columns` has the rule)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pymysql

from airflow_eo.core.columns import add_column_statements, missing_columns
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.mysql.connection import connect
from airflow_eo.mysql.sql import add_column_statement, column_type

log = logging.getLogger(__name__)

ER_DUP_FIELDNAME = 1060


def add_new_columns(name: str, connect_kwargs: Mapping[str, Any], table: str, table_columns: Sequence[str],
                    output: Sequence[tuple[str, str]], add: bool) -> list[str]:
    """The columns added to ``table`` (none when the output has no new one); raises, before any side effect, when
    there are new ones and ``add`` is False. Idempotent: a column another attempt added meanwhile is taken as it is."""
    missing = missing_columns(output, table_columns)
    if not missing:
        return []
    statements = add_column_statements(name, table, missing, column_type,
                                       functools.partial(add_column_statement, table), add, table_columns)
    conn = connect(connect_kwargs, autocommit=True, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            for statement in statements:
                try:
                    cur.execute(statement)
                except pymysql.err.OperationalError as exc:
                    if exc.args and exc.args[0] == ER_DUP_FIELDNAME:
                        continue  # added by an earlier attempt
                    raise ConfigurationError(f"{name}: cannot add a column to {table!r} ({exc.args[-1]}); run it "
                                             f"as a user with the ALTER privilege: {statement}") from exc
    finally:
        conn.close()
    log.info("%s: added column(s) %s to %s", name, ", ".join(c for c, _ in missing), table)
    return [c for c, _ in missing]
