"""Connections as plain data, and the role through which registered kinds find theirs (the Airflow layer reads
them from Airflow connections: ``airflow_eo/hooks/connected_sinks.py``)."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionInfo:
    """An Airflow connection as plain data (the fields every connection type has); the password never prints."""

    conn_id: str
    conn_type: str | None = None
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    schema: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def server_login(self, default_port: int) -> dict[str, Any]:
        """``host``, ``port``, ``user`` and ``password`` of a database server (localhost and ``default_port`` when
        unset), the arguments every database driver takes under these names."""
        return {"host": self.host or "localhost", "port": int(self.port or default_port), "user": self.login or "",
                "password": self.password or ""}


class Connections(Protocol):
    """Where a sink's factory finds its connections (the Airflow layer reads them from Airflow connections)."""

    def connection(self, conn_id: str) -> ConnectionInfo:
        """The connection ``conn_id`` (a database's: host, port, login, ...)."""
    def kafka_config(self, conn_id: str) -> dict[str, Any]:
        """The librdkafka config of the ``kafka`` connection ``conn_id``, as the Kafka provider resolves it."""


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is this machine: ``localhost``, a loopback address, or a Unix socket's folder (``/...``);
    a password sent there crosses no network."""
    if not host or host == "localhost" or host.startswith("/"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: wherever it resolves, the path to it is a network


_WARNED: set[tuple[str, str, int | None]] = set()


def warn_unverified_tls(info: ConnectionInfo, database: str, how_to_verify: str) -> None:
    """Warn (once per process and server) that ``info`` sends its password to a server across a network without a
    verified TLS session: whoever is on the path can pose as the server (strip or answer the TLS) and read it."""
    if is_loopback(info.host) or (info.conn_id, str(info.host), info.port) in _WARNED:
        return
    _WARNED.add((info.conn_id, str(info.host), info.port))
    log.warning(
        "connection %r: the %s server %s:%s is reached over the network without verified TLS, so the password can be "
        "read by anyone on the path who poses as the server; %s", info.conn_id, database, info.host, info.port,
        how_to_verify)
