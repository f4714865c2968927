"""A Kafka record's headers as the dead-letter tables keep them (their ``kafka_headers`` column).

The encoding is JSON text: an array with one object per header, in the record's order, ``{"key": KEY, "value":
BASE64}``; a null header value is JSON ``null``; a record without headers is ``[]``. Duplicate keys stay separate
elements. Why this and not a binary encoding: both databases read it back in SQL (MySQL/MariaDB ``JSON_TABLE`` +
``FROM_BASE64``, PostgreSQL ``json_array_elements`` + ``decode(.., 'base64')``), and so can any language; base64
keeps a value's bytes whatever they are (a header value is bytes, often not UTF-8). A key is text in Kafka's record
format (the Java client, and so Spark, reads it as UTF-8): it is kept as a JSON string. The text is ASCII only (any
other character ``\\uXXXX``-escaped), so no column charset or collation can alter it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

#: A record's headers, in order: (key, value or None).
Headers = tuple[tuple[str, bytes | None], ...]
#: The text of a record without headers.
NO_HEADERS = "[]"


def encode_headers(headers: Iterable[tuple[str, bytes | bytearray | None]] | None) -> str:
    """The ``kafka_headers`` text of a record's headers (None: the record has none, ``[]``)."""
    return json.dumps([{"key": key, "value": None if value is None else base64.b64encode(value).decode("ascii")}
                       for key, value in headers or ()], separators=(",", ":"), ensure_ascii=True)


def encode_header_structs(headers: Iterable[Mapping[str, Any]] | None) -> str:
    """:func:`encode_headers` of headers as Spark hands them over (Arrow / Row structs of ``key`` and ``value``)."""
    return encode_headers((h["key"], h["value"]) for h in headers or ())


def decode_headers(text: str | bytes | None) -> Headers | None:
    """A ``kafka_headers`` text back to the headers; None for NULL (a row written before the column existed)."""
    if text is None:
        return None
    try:
        found = json.loads(text)
        if not isinstance(found, list) or not all(isinstance(h, dict) and isinstance(h["key"], str) for h in found):
            raise ValueError("not an array of objects with a text key")
        return tuple((h["key"], None if h["value"] is None else base64.b64decode(h["value"], validate=True))
                     for h in found)
    except (ValueError, TypeError, KeyError, binascii.Error) as exc:
        raise ValueError(f"not a kafka_headers value (a JSON array of {{key, value}} objects): {exc}") from exc
