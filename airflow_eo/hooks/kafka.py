"""Kafka connections (the ``kafka`` type of apache-airflow-providers-apache-kafka)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.sdk import BaseHook

from airflow_eo.core.backlog import backlog, lag_of, unprocessed_ranges
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.kafka.schema_registry import registry_lookup


class KafkaClusterHook(KafkaBaseHook):
    """librdkafka config from a ``kafka`` connection's extra, and the offset look-ups built on it.

    :param kafka_config_id: the connection id (default ``kafka_default``).
    """

    _offset_source: KafkaOffsetSource | None = None

    def _get_client(self, config: dict[str, Any]) -> dict[str, Any]:
        # No public API of KafkaBaseHook returns the resolved config: its public ``get_conn``
        # resolves the connection's extra (allow-listed dotted-path callbacks, the Google Managed
        # Kafka / Amazon MSK IAM ``oauth_cb``) and hands the result to ``_get_client``, the
        # override point the provider's own KafkaConsumerHook / KafkaProducerHook use to choose
        # what ``get_conn`` builds. Our clients (admin, consumers, transactional producers) each add
        # their own keys to that config, so this hook's ``get_conn`` is the config itself. Unlike
        # the private ``_build_config`` (added in a later provider release), ``get_conn`` and
        # ``_get_client`` resolve the config the same way in every provider release we accept.
        return config

    def get_config(self) -> dict[str, Any]:
        """The connection's librdkafka config as the provider resolves it (a copy: callers add keys)."""
        return dict(self.get_conn)

    def get_offset_source(self) -> KafkaOffsetSource:
        """The hook's offset source, made once (as the provider's ``get_conn`` is): a batch's planning, metrics and
        consumer-group mirror share its admin client, which librdkafka makes thread safe and the source makes again
        after a transient error. A new client waited ~50 ms for its first answer (measured on the stack's broker): a
        run paid that three times."""
        if self._offset_source is None:
            self._offset_source = KafkaOffsetSource(self.get_config())
        return self._offset_source

    def backlog(self, topics: Sequence[str], committed: Mapping[tuple[str, int], int],
                starting_offsets: str | int = "earliest") -> dict[str, int]:
        """Unprocessed offsets per ``"topic[partition]"``: the broker's last stable offset minus ``committed``.

        Read ``committed`` before calling this (:meth:`OffsetStoreHook.committed_offsets
        <airflow_eo.hooks.offset_store.OffsetStoreHook.committed_offsets>`): a committed offset never
        exceeds a last stable offset read after it, while one read after the broker could be beyond it.

        :param topics: the pipeline's topics.
        :param committed: the pipeline's committed next offset per ``(topic, partition)``.
        :param starting_offsets: where a partition without a committed offset starts (as the operator's).
        """
        return backlog(self.get_offset_source().partition_offsets(topics, starting_offsets), committed)

    def backlog_and_first_timestamps(self, topics: Sequence[str], committed: Mapping[tuple[str, int], int],
                                     starting_offsets: str | int = "earliest") -> tuple[dict[str, int], dict[str, int]]:
        """:meth:`backlog`, and the timestamp (ms) of each partition's first unprocessed record (read from Kafka:
        one record of each partition that is behind)."""
        return self.backlogs(topics, [committed], starting_offsets, first_timestamps=True)[0]

    def backlogs(self, topics: Sequence[str], positions: Sequence[Mapping[tuple[str, int], int]],
                 starting_offsets: str | int = "earliest",
                 first_timestamps: bool = False) -> list[tuple[dict[str, int], dict[str, int]]]:
        """:meth:`backlog` counted from each of ``positions`` (e.g. the committed offsets, and where the planned
        batches end) with one look at the broker's offsets, in their order; with ``first_timestamps`` also the
        timestamp (ms) of each partition's first record from there (one record read per partition and distinct
        position), else an empty mapping.

        :param topics: the pipeline's topics.
        :param positions: next offsets per ``(topic, partition)``, read from the store before calling this.
        :param starting_offsets: where a partition without a position starts (as the operator's).
        :param first_timestamps: also read the first records' timestamps.
        """
        source = self.get_offset_source()
        partitions = source.partition_offsets(topics, starting_offsets)
        found: dict[tuple[tuple[str, int], int], int] = {}  # (partition, offset) -> timestamp, each read once
        seen: list[tuple[dict[str, int], dict[str, int]]] = []
        for start in positions:
            ranges = unprocessed_ranges(partitions, start)
            first: dict[str, int] = {}
            if first_timestamps:
                wanted = {r.key: r.from_offset for r in ranges if r.size}
                unread = {k: o for k, o in wanted.items() if (k, o) not in found}
                found.update({(k, unread[k]): ms for k, ms in source.first_timestamps(unread).items()})
                first = {f"{t}[{p}]": found[(t, p), o] for (t, p), o in wanted.items() if ((t, p), o) in found}
            seen.append((lag_of(ranges), first))
        return seen


def schema_registry_lookup(conn_id: str) -> Callable[[int], str | None]:
    """Writer schemas by id from the schema registry of an Airflow connection (any type, ``http`` by default):
    host (a URL, or a host name with ``schema`` and ``port``), login and password for basic auth, and more
    ``SchemaRegistryClient`` config (``ssl.ca.location``, ...) in the extra."""
    conn = BaseHook.get_connection(conn_id)
    host = conn.host or ""
    url = host if "://" in host else f"{conn.schema or 'http'}://{host}" + (f":{conn.port}" if conn.port else "")
    config: dict[str, Any] = {**conn.extra_dejson, "url": url}
    if conn.login:
        config["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
    return registry_lookup(config)
