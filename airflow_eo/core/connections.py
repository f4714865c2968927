"""Connections as plain data, and the role through which registered kinds find theirs (the Airflow layer reads
them from Airflow connections: ``airflow_eo/hooks/sinks.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


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


class Connections(Protocol):
    """Where a sink's factory finds its connections (the Airflow layer reads them from Airflow connections)."""

    def connection(self, conn_id: str) -> ConnectionInfo:
        """The connection ``conn_id`` (a database's: host, port, login, ...)."""
    def kafka_config(self, conn_id: str) -> dict[str, Any]:
        """The librdkafka config of the ``kafka`` connection ``conn_id``, as the Kafka provider resolves it."""
