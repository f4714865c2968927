"""Create an example's topic (its DAGs' setup task). Reading a topic whole: the repository's ``examples/topics.py``."""

from __future__ import annotations

from functools import cached_property

from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook
from confluent_kafka.admin import AdminClient


class _BootstrapAdminHook(KafkaAdminClientHook):
    """The provider's admin hook on a bootstrap string instead of a ``kafka`` connection.

    :func:`ensure_topic` takes a bootstrap string, not a connection id (the demo, the benchmark,
    the tests and the example DAGs pass one); ``KafkaAdminClientHook.create_topic`` takes its
    admin client from the public ``get_conn``, so only that is replaced.
    """

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.bootstrap = bootstrap

    # KafkaBaseHook already turns BaseHook's get_conn method into a cached_property, and
    # create_topic reads it as one; mypy checks this override against BaseHook's method.
    @cached_property
    def get_conn(self) -> AdminClient:  # type: ignore[override]
        return AdminClient({"bootstrap.servers": self.bootstrap})


def ensure_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    """Create ``topic`` with ``partitions`` partitions (replication factor 1) unless it exists.

    Idempotent, and safe against a concurrent creator: ``KafkaAdminClientHook.create_topic``
    logs ``TOPIC_ALREADY_EXISTS`` instead of raising it.
    """
    hook = _BootstrapAdminHook(bootstrap)
    if topic not in hook.get_conn.list_topics(timeout=10).topics:
        hook.create_topic([(topic, partitions, 1)])
