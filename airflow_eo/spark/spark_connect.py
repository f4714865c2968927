"""Spark Connect from this side: its URL (every parameter percent-encoded so that pyspark reads it back exactly),
the forms its token takes and how they are kept out of errors and logs, what makes pyspark refuse a Connect session,
and how to tell a Connect session from a classic one.

Separate from the session (``session.py``) because the hook that reads a Spark Connect connection, the engine and
the Avro decoding need these without opening a session.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote

from airflow_eo.core.errors import ConfigurationError


def refuse_master_for_connect(conf: Mapping[str, str]) -> None:
    """A Spark Connect session runs on the server's master: a ``spark.master`` in the conf, or ``MASTER`` in this
    process's environment, makes pyspark refuse it with an error that quotes the URL, token included. Refused here
    first, saying what to remove."""
    if "spark.master" in conf:
        raise ConfigurationError(
            "spark.master is set in the Spark conf of a Spark Connect session (the connection's extra 'conf' or the "
            "operator's spark_conf): the Spark Connect server decides where the work runs; remove spark.master, "
            "or use a 'spark' connection (its host is the master URL) to run the driver here")
    if "MASTER" in os.environ:
        raise ConfigurationError(
            "the MASTER environment variable is set in this worker, and pyspark refuses a Spark Connect session "
            "then: unset MASTER in the worker's environment, or use a 'spark' connection to run the driver here")


def connect_url(host: str, port: int | None = None, user_id: str | None = None, token: str | None = None,
                use_ssl: Any = None) -> str:
    """A Spark Connect URL (``sc://host:port/;user_id=..;token=..;use_ssl=..``) that pyspark reads back exactly.

    Every parameter is percent-encoded with no character left as is: pyspark splits the parameters on ``;`` and
    ``=`` and parses the URL's path, so a ``/``, ``;`` or ``=`` of a token (base64 has ``/`` and ``=``) left
    unencoded makes it refuse the URL and echo it, token and all, in its error.

    :param host: ``host``, ``host:port`` or ``sc://host[:port]``.
    :param port: the port (None: the one in ``host``, else pyspark's default).
    :param user_id: the user id sent to the server.
    :param token: the bearer token (pyspark then uses TLS).
    :param use_ssl: TLS without a token (None: pyspark's default).
    """
    netloc = host.split("://", 1)[-1].rstrip("/")
    if "/" in netloc or ";" in netloc:
        raise ConfigurationError(f"Spark Connect host {without_secrets(host)!r} must be host or host:port")
    if port:
        netloc = f"{netloc}:{int(port)}"
    params = [f"{name}={quote(str(value), safe='')}" for name, value in
              (("user_id", user_id), ("token", token), ("use_ssl", use_ssl)) if value not in (None, "")]
    return f"sc://{netloc}/" + (f";{';'.join(params)}" if params else "")


def without_secrets(url: str) -> str:
    """A Spark Connect URL without its parameters (the token must not reach logs)."""
    return url.split(";", 1)[0]


def spellings(secret: str) -> set[str]:
    """The forms a secret takes in a Spark Connect URL and in pyspark's errors: as is and percent-encoded (ours
    encodes every character, the Spark provider's leaves ``/``, a form may use ``+`` for a blank)."""
    return {secret, quote(secret), quote(secret, safe=""), quote_plus(secret)} - {""}


def redacted(text: str, url: str) -> str:
    """``text`` without the URL's parameter values in any spelling, nor anything after a ``;`` up to a blank or
    quote (a URL's parameters)."""
    for param in url.split(";")[1:]:
        name, _, given = param.partition("=")
        if name == "use_ssl":  # "true" is no secret, and blanking it would blank ordinary words
            continue
        for form in sorted(spellings(unquote(given)) | {given}, key=len, reverse=True):
            if form:
                text = text.replace(form, "***")
    return re.sub(r";[^\s'\"]+", ";***", text)


def is_connect(session: Any) -> bool:
    """True for a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(session).__module__.startswith("pyspark.sql.connect")

