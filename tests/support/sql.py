"""A statement runner on a sink's database through its descriptor (``SqlDatabase``), whatever the database."""

from __future__ import annotations

from typing import Any


def database_query(database: Any, connect_kwargs: dict[str, Any]) -> Any:
    """``query(statement)``: a SELECT's rows as dicts, any other statement run in autocommit (no rows)."""
    def query(statement: str) -> list[dict[str, Any]]:
        if statement.lstrip().upper().startswith("SELECT"):
            return database.read_dicts(connect_kwargs, statement, ())  # type: ignore[no-any-return]
        conn = database.connect(connect_kwargs, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()
        return []

    return query
