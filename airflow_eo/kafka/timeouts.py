"""How long airflow_eo waits on the Kafka cluster, in one place (both clients of the room read them here)."""

from typing import Any

#: Admin requests: metadata, offsets, configs, consumer-group offsets (retried while the error is transient).
ADMIN_TIMEOUT_S = 30.0
#: The transactional producer's calls (init, flush of a batch's output, send offsets, commit, abort) and the wait
#: for a just-committed transaction's group offsets to become stable: each may cover a whole batch's output.
TRANSACTION_TIMEOUT_S = 60.0
#: librdkafka settings of every client of the room, unless the connection's extra sets them. A new client learns the
#: broker list from its bootstrap connection, drops that connection, and connects to a listed broker only after its
#: "sparse connect" interval: half of ``reconnect.backoff.ms`` (librdkafka's 100 ms default: 50 ms; at least 11 ms).
#: Measured on the stack's broker: a new admin client's first metadata answer in 55 ms, in 4-16 ms at 20 ms. Later
#: reconnects still back off exponentially up to ``reconnect.backoff.max.ms``.
#: ``allow.auto.create.topics``: a metadata request that names a topic (a producer's ``list_topics(topic)``) asks the
#: broker not to create it (librdkafka's default for a producer is to ask, where the broker auto-creates topics): a
#: topic missing or deleted is an error that says so, not a new empty topic. The transactional producer sets it again
#: over the connection's extra.
CLIENT_DEFAULTS: dict[str, Any] = {"reconnect.backoff.ms": 20, "allow.auto.create.topics": False}


def client_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a connection's librdkafka settings) over :data:`CLIENT_DEFAULTS`."""
    return {**CLIENT_DEFAULTS, **config}
