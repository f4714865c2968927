"""SQL text for the MySQL sinks: identifiers validated and quoted, values as ``%s`` placeholders."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from airflow_eo.core.batch import DEAD_LETTER_FIELDS
from airflow_eo.core.config import DELETE_COLUMN
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import quote_identifier, quote_table
from airflow_eo.sqlsink.database import dead_letter_table_ddl, missing_column_statements


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


#: How Arrow writes the bulk load's CSV files: strings quoted with doubled quotes, NULL as the bare word, no escapes.
_CSV_FILE = ("CHARACTER SET utf8mb4 FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' "
             "LINES TERMINATED BY '\\n'")


def load_staging_statement(columns: int) -> str:
    """``LOAD DATA LOCAL INFILE %s`` of an Arrow-written CSV file (strings quoted with doubled quotes, NULL as the
    bare word ``NULL``, no backslash escapes) into the staging table."""
    names = ", ".join(f"`_eo_c{i}`" for i in range(columns))
    return f"LOAD DATA LOCAL INFILE %s INTO TABLE `{STAGING_TABLE}` {_CSV_FILE} ({names})"


def load_replacing_statement(table: str, columns: Sequence[str], hex_columns: frozenset[int] = frozenset(),
                             stamped: Sequence[str] = ()) -> str:
    """``LOAD DATA LOCAL INFILE %s REPLACE`` of an Arrow-written CSV file (as :func:`load_staging_statement` reads
    one) straight into ``table``: a row of a key the table has replaces the old one whole, later rows of the file
    replace earlier ones. Only where that equals the upsert
    (:func:`~.table_shape.why_replace_is_not_upsert`). ``hex_columns``: positions holding hexadecimal text
    of binary values, read into variables and ``UNHEX``-ed. ``stamped``: columns the server sets to the load's time
    (``CURRENT_TIMESTAMP(3)``, what their default would have given a new row)."""
    quoted = [quote_identifier(c, "column name") for c in columns]
    fields = [f"@`_eo_h{i}`" if i in hex_columns else q for i, q in enumerate(quoted)]
    unhex = [f"{quoted[i]} = UNHEX(@`_eo_h{i}`)" for i in sorted(hex_columns)]
    unhex += [f"{quote_identifier(c, 'column name')} = CURRENT_TIMESTAMP(3)" for c in stamped]
    return (f"LOAD DATA LOCAL INFILE %s REPLACE INTO TABLE {quote_table(table)} {_CSV_FILE} ({', '.join(fields)})"
            + (f" SET {', '.join(unhex)}" if unhex else ""))


def upsert_from_staging_statement(
    table: str,
    columns: Sequence[str],
    key_columns: Sequence[str],
    updates: Mapping[str, str],
    hex_columns: frozenset[int] = frozenset(),
    source: str = f"`{STAGING_TABLE}`",
    staged: Sequence[str] | None = None,
) -> str:
    """The staging table's rows into ``table`` with the same updates as :func:`upsert_statement`, ordered by key and
    then load order: the rows of one key still go in load order (the last one wins), and the table's index is
    written in key order, not at random (measured: the INSERT .. SELECT of 500,000 random keys ~20-50% faster).

    The ``ON DUPLICATE KEY UPDATE`` clause names the staged values by their own column names (``_eo_c0`` ..):
    unambiguous next to the target's columns, and the same text on MariaDB and MySQL 8 (no ``VALUES()``).
    ``hex_columns``: positions staged as hexadecimal text of binary values, ``UNHEX``-ed.
    """
    quoted = [quote_identifier(c, "column name") for c in columns]
    names = list(staged or [f"`_eo_c{i}`" for i in range(len(columns))])
    selected = [f"UNHEX({c})" if i in hex_columns else c for i, c in enumerate(names)]
    # The update clause names a staged value by its bare name (a joined source qualifies it in the SELECT only).
    bare = [f"UNHEX({n.split('.')[-1]})" if i in hex_columns else n.split(".")[-1] for i, n in enumerate(names)]
    assignments = []
    for column, q, new in zip(columns, quoted, bare, strict=True):
        if column in key_columns:
            continue
        assignments.append(f"{q} = {q} + {new}" if updates.get(column, "replace") == "add" else f"{q} = {new}")
    if not assignments:  # key-only table: keep the row as it is
        k = quote_identifier(key_columns[0])
        assignments.append(f"{k} = {k}")
    order = [*(names[columns.index(k)] for k in key_columns), f"`{STAGING_SEQ}`"]
    return (f"INSERT INTO {quote_table(table)} ({', '.join(quoted)}) SELECT {', '.join(selected)} "
            f"FROM {source} ORDER BY {', '.join(order)} ON DUPLICATE KEY UPDATE {', '.join(assignments)}")


#: Session-private table of the keys with tombstones among the staged rows (``on_tombstone="delete"``), with the
#: load order of each key's last tombstone. A second table: MySQL cannot open a TEMPORARY table twice in a query.
TOMBSTONES_TABLE = "_airflow_eo_tombstones"


#: InnoDB's longest index key (bytes), shared by the text key columns of the tombstones' index (4 bytes a character).
_INDEX_KEY_BYTES = 3072


def tombstones_table_ddl(columns: Sequence[str], key_columns: Sequence[str], types: Sequence[str]) -> str:
    """The keys of the staged tombstones (``_eo_d0`` ..) and the load order of each key's last one, indexed by key:
    the upsert that follows looks every staged row's key up in it (without the index, MariaDB compared each staged
    row with every tombstone: 100,000 staged rows with 10,000 tombstones took 126 s, 1.3 s with it). ``types``: the
    staging types of ``columns``; a text key is indexed by a prefix (the look-up still compares whole values)."""
    delete = columns.index(DELETE_COLUMN)
    keys = [f"`_eo_c{columns.index(k)}`" for k in key_columns]
    picked = ", ".join(f"{k} AS `_eo_d{i}`" for i, k in enumerate(keys))
    prefix = _INDEX_KEY_BYTES // (4 * len(key_columns))
    indexed = ", ".join(f"`_eo_d{i}`({prefix})" if "TEXT" in types[columns.index(k)] else f"`_eo_d{i}`"
                        for i, k in enumerate(key_columns))
    return (f"CREATE TEMPORARY TABLE `{TOMBSTONES_TABLE}` (KEY ({indexed})) ENGINE=InnoDB AS SELECT {picked}, "
            f"MAX(`{STAGING_SEQ}`) AS `_eo_dseq` FROM `{STAGING_TABLE}` WHERE `_eo_c{delete}` <> 0 "
            f"GROUP BY {', '.join(keys)}")


def delete_tombstones_statement(table: str, key_columns: Sequence[str]) -> str:
    """Deletes the row of every key with a staged tombstone (the upsert that follows writes only the rows loaded
    after a key's last tombstone: a key deleted then written again in one batch gets a fresh row)."""
    match = " AND ".join(f"`_eo_t`.{quote_identifier(k)} = `_eo_d`.`_eo_d{i}`" for i, k in enumerate(key_columns))
    return f"DELETE `_eo_t` FROM {quote_table(table)} AS `_eo_t` JOIN `{TOMBSTONES_TABLE}` AS `_eo_d` ON {match}"


def upsert_after_tombstones_statement(table: str, columns: Sequence[str], key_columns: Sequence[str],
                                      updates: Mapping[str, str], hex_columns: frozenset[int] = frozenset()) -> str:
    """:func:`upsert_from_staging_statement` of the staged rows that are no tombstones and come after their key's
    last tombstone, if any (``hex_columns``: positions in ``columns`` staged as hexadecimal text)."""
    delete = columns.index(DELETE_COLUMN)
    written = [c for c in columns if c != DELETE_COLUMN]
    match = " AND ".join(f"`_eo_s`.`_eo_c{columns.index(k)}` = `_eo_d`.`_eo_d{i}`" for i, k in enumerate(key_columns))
    source = (f"`{STAGING_TABLE}` AS `_eo_s` LEFT JOIN `{TOMBSTONES_TABLE}` AS `_eo_d` ON {match} "
              f"WHERE `_eo_s`.`_eo_c{delete}` = 0 AND (`_eo_d`.`_eo_dseq` IS NULL OR "
              f"`_eo_s`.`{STAGING_SEQ}` > `_eo_d`.`_eo_dseq`)")
    staged = [f"`_eo_s`.`_eo_c{columns.index(c)}`" for c in written]
    hexed = frozenset(i for i, c in enumerate(written) if columns.index(c) in hex_columns)
    return upsert_from_staging_statement(table, written, key_columns, updates, hexed, source=source, staged=staged)


def delete_statement(table: str, key_columns: Sequence[str]) -> str:
    """One row's delete by its key (the multi-row path's tombstone)."""
    match = " AND ".join(f"{quote_identifier(k)} = %s" for k in key_columns)
    return f"DELETE FROM {quote_table(table)} WHERE {match}"


def add_column_statement(table: str, column: str, sql_type: str) -> str:
    return f"ALTER TABLE {quote_table(table)} ADD COLUMN {quote_identifier(column, 'column name')} {sql_type} NULL"


#: The columns a dead-letter table gained after its first version (append only): (version, column, type). A table
#: made by an older release is brought up to date by :func:`dead_letter_upgrades` before a batch writes to it; its
#: version is the newest whose column it has. Each step is idempotent: taken only when its column is missing, and a
#: duplicate column (added meanwhile by another pipeline sharing the table) counts as done.
DEAD_LETTER_MIGRATIONS: list[tuple[int, str, str]] = [
    # The record's Kafka headers: JSON text (airflow_eo.core.headers), NULL in rows written before version 2.
    (2, "kafka_headers", "LONGTEXT"),
]


def dead_letter_upgrades(table: str, columns: Iterable[str]) -> list[tuple[str, str]]:
    """``(column, ALTER TABLE statement)`` of each column an existing dead-letter table with ``columns`` lacks (MySQL
    column names compare without case)."""
    return missing_column_statements(table, columns, DEAD_LETTER_MIGRATIONS, add_column_statement, True)


#: Version 3 of the dead-letter table: ids and topics compared byte for byte. Releases before it made the table in
#: the server's default collation (latin1_swedish_ci on MariaDB, utf8mb4_0900_ai_ci on MySQL 8: case-insensitive),
#: where pipelines "p" and "P", or topics "Orders" and "orders", share a primary key.
DEAD_LETTER_COLLATION = "utf8mb4_bin"


def dead_letter_collation_upgrade(table: str, collations: Mapping[str, str | None]) -> str | None:
    """The statement that converts a dead-letter table whose ``pipeline_id`` or ``topic`` column (``collations``:
    column → collation, from information_schema) is not byte for byte; None when both are."""
    keyed = {c.lower(): collation for c, collation in collations.items()}
    if all(keyed.get(column) == DEAD_LETTER_COLLATION for column in ("pipeline_id", "topic")):
        return None
    return f"ALTER TABLE {quote_table(table)} CONVERT TO CHARACTER SET utf8mb4 COLLATE {DEAD_LETTER_COLLATION}"


def dead_letter_ddl(table: str) -> str:
    return dead_letter_table_ddl(
        quote_table(table), binary="LONGBLOB", created_at="TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)",
        migrations=DEAD_LETTER_MIGRATIONS,
        # Ids and topics byte for byte, as in the offset store: "Orders" and "orders" are two topics.
        table_options=f" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={DEAD_LETTER_COLLATION}")


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


#: The global privileges that show a user every table of the server in ``information_schema`` (any one of them; a
#: table is listed to a user who holds some privilege on it).
TABLE_VISIBILITY_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "REFERENCES", "INDEX",
                               "ALTER", "CREATE VIEW", "SHOW VIEW", "TRIGGER", "DELETE HISTORY")


def innodb_dictionary_name(database: str, table: str) -> str | None:
    """The name MariaDB's InnoDB dictionary (``information_schema.INNODB_SYS_FOREIGN``'s ``REF_NAME``) gives table
    ``database.table``: ``database/table``. None when InnoDB would encode either name in its file names: a
    character other than ASCII letters, digits and ``_``, or a name a Windows device has (``CON``, ``AUX``,
    ``COM1`` ..: MariaDB appends ``@@@`` on every platform). The caller then asks ``information_schema``."""
    if not all(re.fullmatch(r"[0-9A-Za-z_]+", name) and not _DEVICE_NAME.fullmatch(name) for name in (database, table)):
        return None
    return f"{database}/{table}"


#: the names MariaDB's ``tablename_to_filename`` marks with ``@@@`` (Windows devices), compared without case
_DEVICE_NAME = re.compile(r"(?i)con|prn|aux|nul|com[1-9]|lpt[1-9]")
