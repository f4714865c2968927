"""Validation and quoting of SQL identifiers (tables, columns). Values are always bound."""

from __future__ import annotations

import re

from airflow_eo.core.errors import ConfigurationError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # fullmatch: "$" would let "name\n" through
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's own rule for topic names
#: The offset store's pipeline_id columns hold this many characters (a longer id would be cut, not refused).
PIPELINE_ID_LENGTH = 190
# Airflow's dag and task ids' characters, and "+" (a mapped task's default id joins its topics with it): safe to
# paste into the SQL and shell commands the operations suggest.
_PIPELINE_ID = re.compile(rf"[A-Za-z0-9._+-]{{1,{PIPELINE_ID_LENGTH}}}")


def validate_identifier(name: str, what: str = "identifier") -> str:
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"invalid {what} {name!r}: use letters, digits and underscores "
            "(starting with a letter or underscore, at most 64 characters)"
        )
    return name


def backquote(name: str) -> str:
    """A name in Spark SQL's backticks (a backtick in it doubled): any column name of a DataFrame."""
    return "`" + name.replace("`", "``") + "`"


def quote_identifier(name: str, what: str = "identifier") -> str:
    return f"`{validate_identifier(name, what)}`"


def quote_table(name: str) -> str:
    """``table`` or ``schema.table``, each part validated and quoted."""
    parts = name.split(".") if isinstance(name, str) else [name]
    if len(parts) > 2:
        raise ConfigurationError(f"invalid table name {name!r}: use 'table' or 'database.table'")
    return ".".join(quote_identifier(p, "table name") for p in parts)


def validate_pipeline_id(name: str) -> str:
    """A pipeline id the offset store keeps whole and that reads the same in a shell command or SQL text."""
    if not isinstance(name, str) or not _PIPELINE_ID.fullmatch(name):
        raise ConfigurationError(
            f"invalid pipeline_id {name!r}: use 1 to {PIPELINE_ID_LENGTH} letters, digits, '.', '_', '-' or '+' "
            "(the offset store's column holds that many; the default id is '<dag_id>.<task_id>')"
        )
    return name


def validate_topic(name: str, what: str = "Kafka topic") -> str:
    """A legal Kafka topic name (Kafka refuses others: better at parse time than at the first run)."""
    if not isinstance(name, str) or not _TOPIC.fullmatch(name) or name in (".", ".."):
        raise ConfigurationError(
            f"invalid {what} {name!r}: Kafka topic names are 1 to 249 letters, digits, '.', '_' or '-'"
        )
    return name
