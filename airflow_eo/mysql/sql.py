"""SQL text for the MySQL sinks: identifiers validated and quoted, values as ``%s`` placeholders."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import quote_identifier, quote_table
from airflow_eo.core.protocol import DEAD_LETTER_FIELDS


def upsert_statement(
    table: str,
    columns: Sequence[str],
    key_columns: Sequence[str],
    updates: Mapping[str, str],
    rows: int,
    row_alias: bool,
) -> str:
    """Multi-row ``INSERT .. ON DUPLICATE KEY UPDATE`` for ``rows`` rows.

    ``updates`` maps a column to ``"add"`` (accumulate) or ``"replace"`` (the default).
    ``row_alias``: MySQL 8.0.19+ form (``VALUES (..) AS new .. c = new.c``); otherwise the
    ``VALUES(c)`` form MariaDB wants (deprecated on MySQL 8).
    """
    if rows < 1:
        raise ValueError("rows must be >= 1")
    quoted = [quote_identifier(c, "column name") for c in columns]
    placeholders = "(" + ", ".join(["%s"] * len(columns)) + ")"
    sql = f"INSERT INTO {quote_table(table)} ({', '.join(quoted)}) VALUES " + ", ".join([placeholders] * rows)
    if row_alias:
        sql += " AS `eo_new`"
    assignments = []
    for column in columns:
        if column in key_columns:
            continue
        q = quote_identifier(column)
        new = f"`eo_new`.{q}" if row_alias else f"VALUES({q})"
        if updates.get(column, "replace") == "add":
            assignments.append(f"{q} = {q} + {new}")
        else:
            assignments.append(f"{q} = {new}")
    if not assignments:  # key-only table: keep the row as it is
        k = quote_identifier(key_columns[0])
        assignments.append(f"{k} = {k}")
    return sql + " ON DUPLICATE KEY UPDATE " + ", ".join(assignments)


#: Session-private staging table of the bulk-load path (a TEMPORARY table shadows a real one of the same name in
#: its session only; no user table of the sink is named like this one).
STAGING_TABLE = "_airflow_eo_stage"
#: Rows of the staging table keep their load order: the last of several rows of one key wins, as with statements.
STAGING_SEQ = "_eo_seq"


def staging_table_ddl(column_types: Sequence[str]) -> str:
    """``CREATE TEMPORARY TABLE`` for the bulk-load path: one nullable column per output column (``_eo_c0`` ..),
    typed wide enough that loading converts nothing (the ``INSERT .. SELECT`` into the target does, in strict
    mode, as a multi-row INSERT would), plus the load order."""
    columns = ", ".join(f"`_eo_c{i}` {sql_type} NULL" for i, sql_type in enumerate(column_types))
    return (f"CREATE TEMPORARY TABLE `{STAGING_TABLE}` (`{STAGING_SEQ}` BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
            f"{columns}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")


def load_staging_statement(columns: int) -> str:
    """``LOAD DATA LOCAL INFILE %s`` of an Arrow-written CSV file (strings quoted with doubled quotes, NULL as the
    bare word ``NULL``, no backslash escapes) into the staging table."""
    names = ", ".join(f"`_eo_c{i}`" for i in range(columns))
    return (f"LOAD DATA LOCAL INFILE %s INTO TABLE `{STAGING_TABLE}` CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' LINES TERMINATED BY '\\n' "
            f"({names})")


def upsert_from_staging_statement(
    table: str,
    columns: Sequence[str],
    key_columns: Sequence[str],
    updates: Mapping[str, str],
    hex_columns: frozenset[int] = frozenset(),
) -> str:
    """The staging table's rows, in load order, into ``table`` with the same updates as :func:`upsert_statement`.

    The ``ON DUPLICATE KEY UPDATE`` clause names the staged values by their own column names (``_eo_c0`` ..):
    unambiguous next to the target's columns, and the same text on MariaDB and MySQL 8 (no ``VALUES()``).
    ``hex_columns``: positions staged as hexadecimal text of binary values, ``UNHEX``-ed.
    """
    quoted = [quote_identifier(c, "column name") for c in columns]
    staged = [f"`_eo_c{i}`" for i in range(len(columns))]
    selected = [f"UNHEX({c})" if i in hex_columns else c for i, c in enumerate(staged)]
    assignments = []
    for column, q, new in zip(columns, quoted, selected, strict=True):
        if column in key_columns:
            continue
        assignments.append(f"{q} = {q} + {new}" if updates.get(column, "replace") == "add" else f"{q} = {new}")
    if not assignments:  # key-only table: keep the row as it is
        k = quote_identifier(key_columns[0])
        assignments.append(f"{k} = {k}")
    return (f"INSERT INTO {quote_table(table)} ({', '.join(quoted)}) SELECT {', '.join(selected)} "
            f"FROM `{STAGING_TABLE}` ORDER BY `{STAGING_SEQ}` ON DUPLICATE KEY UPDATE {', '.join(assignments)}")


def dead_letter_ddl(table: str) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {quote_table(table)} ("
        "pipeline_id VARCHAR(190) NOT NULL, topic VARCHAR(249) NOT NULL, kafka_partition INT NOT NULL, "
        "kafka_offset BIGINT NOT NULL, batch_id BIGINT NOT NULL, record_key LONGBLOB NULL, "
        "raw_value LONGBLOB NULL, error TEXT NOT NULL, "
        "created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), "
        "PRIMARY KEY (pipeline_id, topic, kafka_partition, kafka_offset)) ENGINE=InnoDB "
        # Ids and topics byte for byte, as in the offset store: "Orders" and "orders" are two topics.
        "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
    )


#: The dead-letter table's columns: the batches the engine's partition runner hands its writer.
DEAD_LETTER_COLUMNS = DEAD_LETTER_FIELDS


def parse_server_version(version: str) -> tuple[str, tuple[int, int, int]]:
    """``SELECT VERSION()`` → (``'mariadb'`` | ``'mysql'``, (major, minor, patch))."""
    flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
    match = re.match(r"(?:5\.5\.5-)?(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        raise ConfigurationError(f"cannot parse the database server version {version!r}")
    major, minor, patch = (int(x) for x in match.groups())
    return flavor, (major, minor, patch)


def supports_row_alias(flavor: str, version: tuple[int, int, int]) -> bool:
    return flavor == "mysql" and version >= (8, 0, 19)


def keeps_prepared_xa(flavor: str, version: tuple[int, int, int]) -> bool:
    """Older servers roll back a prepared XA branch when its connection closes."""
    return version >= (10, 5, 0) if flavor == "mariadb" else version >= (5, 7, 7)
