"""Checks of JSON text that Spark's JSON reader does not make: shared by the value parse (``parsing.py``) and the
change-event parse (``changes.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

#: A JSON escape of a UTF-16 surrogate without its pair (``"\ud800"``; I-JSON, RFC 7493, forbids them): Spark's JSON
#: reader makes it ``?``, so no column would get the value produced. Java's regex syntax (``rlike``), matched in a
#: text whose escaped backslashes are gone (:data:`ESCAPED_BACKSLASH`), where every backslash starts an escape: a
#: low escape is paired only by a high escape right before it, never by ``\\ud800``'s text (an escaped backslash,
#: then ``ud800``).
LONE_SURROGATE_ESCAPE = (r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                         r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
#: An escaped backslash (``\\``), replaced by a character that is no escape (``_``) before the check: left to right,
#: so ``\\\ud800`` keeps its escape; not by nothing, which would join ``\ud800\\\udc00``'s two lone escapes.
ESCAPED_BACKSLASH = r"\\\\"


def lone_surrogate_error(what: str) -> str:
    """The error of a record whose ``what`` (``value``, ``key``) :func:`has_lone_surrogate_escape`."""
    return (f"{what} has an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF): JSON readers turn it into '?', no "
            "text column can keep it")


def has_lone_surrogate_escape(json_text: Column) -> Column:
    """Whether ``json_text`` (a JSON document) escapes a UTF-16 surrogate without its pair."""
    from pyspark.sql import functions as F

    # A byte search first: most values escape nothing. `contains`, not `instr`, which counts characters as it goes
    # (1M page views read and parsed: 2.38-2.56 s with instr, 2.22-2.28 s with contains, 2.17 s with no check). The
    # two agree on valid UTF-8, which both callers check first.
    return json_text.contains("\\u") & F.regexp_replace(json_text, ESCAPED_BACKSLASH, "_").rlike(LONE_SURROGATE_ESCAPE)


#: Text that may hold a JSON object or array (Java's regex syntax, ``rlike``): JSON's whitespace (RFC 8259), then
#: ``{``, ``[`` or a byte-order mark (left to the parser).
MAY_OPEN_JSON_DOCUMENT = r"^[ \t\n\r]*[{\[\uFEFF]"


def may_open_json_document(json_text: Column) -> Column:
    """Whether ``json_text`` may hold a JSON object or array (:data:`MAY_OPEN_JSON_DOCUMENT`). Any other text fails
    Spark's parse of a struct, whatever the schema, and parsing it costs an exception thrown per record."""
    from pyspark.sql import functions as F

    # The first test alone is what a good record pays.
    return F.startswith(json_text, F.lit("{")) | json_text.rlike(MAY_OPEN_JSON_DOCUMENT)
