"""Validation and quoting of SQL identifiers (tables, columns). Values are always bound."""

from __future__ import annotations

import re

from airflow_eo.core.errors import ConfigurationError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def validate_identifier(name: str, what: str = "identifier") -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigurationError(
            f"invalid {what} {name!r}: use letters, digits and underscores "
            "(starting with a letter or underscore, at most 64 characters)"
        )
    return name


def quote_identifier(name: str, what: str = "identifier") -> str:
    return f"`{validate_identifier(name, what)}`"


def quote_table(name: str) -> str:
    """``table`` or ``schema.table``, each part validated and quoted."""
    parts = name.split(".") if isinstance(name, str) else [name]
    if len(parts) > 2:
        raise ConfigurationError(f"invalid table name {name!r}: use 'table' or 'database.table'")
    return ".".join(quote_identifier(p, "table name") for p in parts)
