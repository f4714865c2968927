"""Output columns a table sink's table lacks (``docs/architecture.md``, "New columns"): named with the exact
``ALTER TABLE`` to run before any write, or added (nullable) when the sink spec says ``add_missing_columns=True``.

Plain Python: each database's room maps Spark's type names (``DataType.simpleString()``) to its SQL types and writes
the statement; the rule and the message live here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError


def missing_columns(output: Sequence[tuple[str, str]], table_columns: Sequence[str]) -> list[tuple[str, str]]:
    """The output's (column, Spark type) pairs that the table lacks (the delete marker is never a column)."""
    return [(name, spark_type) for name, spark_type in output
            if name not in table_columns and name != DELETE_COLUMN]


def add_column_statements(name: str, table: str, missing: Sequence[tuple[str, str]],
                          sql_type: Callable[[str], str | None], statement: Callable[[str, str], str],
                          add: bool, table_columns: Sequence[str]) -> list[str]:
    """The ``ALTER TABLE`` statements adding ``missing`` (nullable, the SQL type of each Spark type); when not
    ``add``, raises before any side effect naming the columns and the statements to run.

    :param sql_type: a Spark type name's SQL type in this database; None when there is no plain mapping.
    :param statement: ``(column, sql type) -> ALTER TABLE ..``.
    """
    typed = [(column, sql_type(spark_type), spark_type) for column, spark_type in missing]
    statements = [statement(column, mapped or f"<a type for Spark's {spark_type}>")
                  for column, mapped, spark_type in typed]
    unmapped = [f"{column} ({spark_type})" for column, mapped, spark_type in typed if mapped is None]
    if add and not unmapped:
        return statements
    columns = ", ".join(column for column, _ in missing)
    why = (f"add_missing_columns=True maps no SQL type for {', '.join(unmapped)}: add them yourself"
           if add else "or set add_missing_columns=True on the sink to add them (nullable) before the write")
    raise ConfigurationError(
        f"{name}: the output has column(s) {columns} that table {table!r} lacks (its columns are "
        f"{', '.join(table_columns)}); nothing was written. Run: {'; '.join(statements)}; {why}")
