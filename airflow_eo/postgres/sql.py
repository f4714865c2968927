"""SQL text for the PostgreSQL sinks: identifiers validated (PostgreSQL's own rule: :func:`validate_identifier`) and
quoted with PostgreSQL's double quotes, values as ``%s`` placeholders.

A quoted name keeps its case: a table created as ``CREATE TABLE App_PV`` (unquoted) is named ``app_pv``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.sqlsink.database import dead_letter_table_ddl, missing_column_statements

#: Session-private staging table of the upsert sink (a TEMP table shadows nothing of the user's: it lives in the
#: session's own ``pg_temp`` schema).
STAGING_TABLE = "_airflow_eo_stage"
#: Rows of a staging table keep their load order: the last of several rows of one key wins. The writer numbers
#: the rows it copies: an identity column would create a sequence with every staging table, for nothing.
STAGING_SEQ = "_eo_seq"


#: PostgreSQL keeps this many bytes of a name (NAMEDATALEN - 1) and silently cuts a longer one: refused instead.
MAX_IDENTIFIER_BYTES = 63


def validate_identifier(name: str, what: str = "identifier") -> str:
    """A name PostgreSQL keeps exactly as given when double-quoted: any text of 1 to 63 bytes (UTF-8) without NUL.
    Quotes, dots, spaces, case and reserved words are all fine once quoted (:func:`quote_identifier`)."""
    try:
        size = len(name.encode()) if isinstance(name, str) else 0
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 name at all
        size = 0
    if not size or size > MAX_IDENTIFIER_BYTES or "\x00" in name:
        raise ConfigurationError(
            f"invalid PostgreSQL {what} {name!r}: a name is 1 to {MAX_IDENTIFIER_BYTES} bytes of UTF-8 without NUL "
            "(PostgreSQL would silently cut a longer one)")
    return name


def quote_identifier(name: str, what: str = "identifier") -> str:
    """``"name"``, an embedded double quote doubled: the exact name, whatever it holds."""
    return '"' + validate_identifier(name, what).replace('"', '""') + '"'


def split_table(name: str) -> tuple[str | None, str]:
    """``table`` or ``schema.table`` → (schema or None, table), each part validated and kept as written (its case
    too). A part holding a dot or a double quote is written double-quoted, as in SQL, an embedded quote doubled:
    ``'"my.schema"."My ""T"" table"'`` is schema ``my.schema``, table ``My "T" table``."""
    if not isinstance(name, str):
        raise ConfigurationError(f"invalid table name {name!r}: use 'table' or 'schema.table'")
    parts: list[str] = []
    i = 0
    while True:
        if name.startswith('"', i):  # a quoted part: up to the quote that is not doubled
            quoted: list[str] = []
            i += 1
            while True:
                end = name.find('"', i)
                if end < 0:
                    raise ConfigurationError(f"invalid table name {name!r}: a double quote is not closed")
                quoted.append(name[i:end])
                if not name.startswith('"', end + 1):
                    break
                quoted.append('"')
                i = end + 2
            parts.append("".join(quoted))
            i = end + 1
            if i < len(name) and name[i] != ".":
                raise ConfigurationError(f"invalid table name {name!r}: a quoted part ends with a quote, then a dot "
                                         "or nothing")
        else:
            end = name.find(".", i)
            end = len(name) if end < 0 else end
            if '"' in name[i:end]:
                raise ConfigurationError(f"invalid table name {name!r}: a part holding a double quote is written "
                                         'double-quoted, the quote doubled: "say ""hi"""')
            parts.append(name[i:end])
            i = end
        if i >= len(name):
            break
        i += 1  # the dot
        if i == len(name):
            parts.append("")  # a trailing dot: an empty name, refused below
            break
    if len(parts) > 2:
        raise ConfigurationError(f"invalid table name {name!r}: use 'table' or 'schema.table' (double-quote a part "
                                 "that holds a dot)")
    for part in parts:
        validate_identifier(part, "table name")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def quote_table(name: str) -> str:
    """``"table"`` or ``"schema"."table"``."""
    schema, table = split_table(name)
    return (f"{quote_identifier(schema)}." if schema else "") + quote_identifier(table)


def staging_ddl(table: str, staging: str, columns: Sequence[str], temporary: bool) -> list[str]:
    """A staging table with the target's column types (so COPY converts as an INSERT into the target would), no
    constraints, and the load order. ``temporary``: the session's TEMP table (the upsert sink); else a table in
    the target's schema, created and dropped inside the caller's transaction (a transaction that touched a TEMP
    table cannot be prepared)."""
    name = staging_name(table, staging, temporary)
    # Not UNLOGGED: PostgreSQL 15 failed its crash recovery ("could not create file ..: File exists") when a
    # SIGKILL left an unlogged relation of an open or prepared transaction (tests/faults/test_postgres_faults.py).
    kind = "TEMP TABLE" if temporary else "TABLE"
    quoted = ", ".join(quote_identifier(c, "column name") for c in columns if c != DELETE_COLUMN)
    ddl = [f"CREATE {kind} {name} AS SELECT {quoted} FROM {quote_table(table)} WITH NO DATA",
           f"ALTER TABLE {name} ADD COLUMN {quote_identifier(STAGING_SEQ)} BIGINT"]
    if DELETE_COLUMN in columns:  # tombstones that delete (on_tombstone="delete")
        ddl.append(f"ALTER TABLE {name} ADD COLUMN {quote_identifier(DELETE_COLUMN)} BOOLEAN")
    return ddl


def staging_name(table: str, staging: str, temporary: bool) -> str:
    """The staging table, quoted: the session's TEMP table, or a table of the target's schema."""
    schema, _ = split_table(table)
    if temporary or not schema:
        return quote_identifier(staging)
    return f"{quote_identifier(schema)}.{quote_identifier(staging)}"


def copy_statement(staging: str, columns: Sequence[str], csv: bool) -> str:
    quoted = ", ".join(quote_identifier(c, "column name") for c in columns)
    return f"COPY {staging} ({quoted}) FROM STDIN" + (" (FORMAT csv)" if csv else "")


def upsert_from_staging_statement(table: str, staging: str, columns: Sequence[str], key_columns: Sequence[str],
                                  updates: Mapping[str, str]) -> str:
    """The staged rows into ``table``: ``INSERT .. SELECT .. ON CONFLICT (keys) DO UPDATE``.

    PostgreSQL refuses to update one row twice in a statement, so the staged rows are first reduced to one per
    key with what writing them one after the other would leave: an overwritten column keeps its last value (load
    order), an added one their sum (``c = t.c + EXCLUDED.c``). With tombstones (:data:`DELETE_COLUMN` staged), a
    key whose last event is a tombstone is not written (:func:`delete_from_staging_statement` deletes it)."""
    if DELETE_COLUMN in columns:
        columns = [c for c in columns if c != DELETE_COLUMN]
        key_list = ", ".join(quote_identifier(k, "key column") for k in key_columns)
        column_list = ", ".join(quote_identifier(c, "column name") for c in columns)
        last = (f"(SELECT DISTINCT ON ({key_list}) {column_list}, {quote_identifier(DELETE_COLUMN)}, "
                f"{quote_identifier(STAGING_SEQ)} FROM {staging} "
                f"ORDER BY {key_list}, {quote_identifier(STAGING_SEQ)} DESC) AS \"_eo_last\" "
                f"WHERE NOT {quote_identifier(DELETE_COLUMN)}")
        return upsert_from_staging_statement(table, last, columns, key_columns, updates)
    quoted = [quote_identifier(c, "column name") for c in columns]
    keys = [quote_identifier(k, "key column") for k in key_columns]
    seq = quote_identifier(STAGING_SEQ)
    adds = {c for c in columns if c not in key_columns and updates.get(c, "replace") == "add"}
    if adds:
        picked = [q if c in key_columns else (f"SUM({q})" if c in adds else f"(ARRAY_AGG({q} ORDER BY {seq} DESC))[1]")
                  for c, q in zip(columns, quoted, strict=True)]
        select = f"SELECT {', '.join(picked)} FROM {staging} GROUP BY {', '.join(keys)}"
    else:
        select = f"SELECT DISTINCT ON ({', '.join(keys)}) {', '.join(quoted)} FROM {staging} " \
                 f"ORDER BY {', '.join(keys)}, {seq} DESC"
    assignments = []
    for column, q in zip(columns, quoted, strict=True):
        if column in key_columns:
            continue
        assignments.append(f'{q} = "_eo_t".{q} + EXCLUDED.{q}' if column in adds else f"{q} = EXCLUDED.{q}")
    action = f"DO UPDATE SET {', '.join(assignments)}" if assignments else "DO NOTHING"
    return (f'INSERT INTO {quote_table(table)} AS "_eo_t" ({", ".join(quoted)}) {select} '
            f"ON CONFLICT ({', '.join(keys)}) {action}")


def delete_from_staging_statement(table: str, staging: str, key_columns: Sequence[str]) -> str:
    """Deletes the rows of every key with a tombstone among the staged rows, run before the upsert of
    :func:`upsert_from_staging_statement`: a key deleted then written again in one batch gets a fresh row (as
    the events one after the other would leave it), one whose last event is a tombstone stays deleted."""
    keys = [quote_identifier(k, "key column") for k in key_columns]
    match = " AND ".join(f'"_eo_t".{k} = "_eo_d".{k}' for k in keys)
    return (f'DELETE FROM {quote_table(table)} AS "_eo_t" USING (SELECT DISTINCT {", ".join(keys)} FROM {staging} '
            f'WHERE {quote_identifier(DELETE_COLUMN)}) AS "_eo_d" WHERE {match}')


def add_column_statement(table: str, column: str, sql_type: str) -> str:
    """Idempotent (``IF NOT EXISTS``): a retry after a crash finds the column there."""
    quoted = quote_identifier(column, "column name")
    return f"ALTER TABLE {quote_table(table)} ADD COLUMN IF NOT EXISTS {quoted} {sql_type}"


#: The columns a dead-letter table gained after its first version (append only): (version, column, type). A table
#: made by an older release is brought up to date by :func:`dead_letter_upgrades` before a batch writes to it; its
#: version is the newest whose column it has. Each step is idempotent (``ADD COLUMN IF NOT EXISTS``).
DEAD_LETTER_MIGRATIONS: list[tuple[int, str, str]] = [
    # The record's Kafka headers: JSON text (airflow_eo.core.headers), NULL in rows written before version 2.
    # TEXT, not JSONB: kept exactly as written (JSONB refuses the escape of a NUL in a key).
    (2, "kafka_headers", "TEXT"),
]


def dead_letter_upgrades(table: str, columns: Iterable[str]) -> list[tuple[str, str]]:
    """``(column, ALTER TABLE statement)`` of each column an existing dead-letter table with ``columns`` lacks."""
    return missing_column_statements(table, columns, DEAD_LETTER_MIGRATIONS, add_column_statement, False)


def dead_letter_ddl(table: str) -> str:
    return dead_letter_table_ddl(quote_table(table), binary="BYTEA",
                                 created_at="TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP",
                                 migrations=DEAD_LETTER_MIGRATIONS)
