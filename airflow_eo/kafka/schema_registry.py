"""Writer schemas by id from a Confluent schema registry: a thin use of confluent-kafka's ``SchemaRegistryClient``.

Optional: the client needs confluent-kafka's ``schemaregistry`` extra (``pip install 'airflow-eo[schema-registry]'``).
No registry server runs in this project's tests: the supplied-schemas path (``writer_schemas``) is the tested one, and
the answers below are classified by :func:`refusal_for_id` (tested on its own).

The lookup's contract (what ``spark/avro.py`` asks of it, once per distinct id and batch): the id's Avro schema as
JSON text; ``LookupError`` (its text says why) for an id the registry does not give us, which makes the records of
that id bad records; any other exception fails the batch (the registry is down, or refuses us whatever the id).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_eo.core.errors import ConfigurationError

#: 4xx answers about the request, not about one id: our credentials (401, 407), a timeout (408), too many requests
#: (429). They fail the batch, to be retried, instead of making every record of the topic a bad record.
NOT_ABOUT_THE_ID = frozenset({401, 407, 408, 429})


def refusal_for_id(schema_id: int, status: int, message: str) -> LookupError | None:
    """What a registry error answering ``schema_id`` means: a ``LookupError`` when it is about that id (404 not
    found, 403 not allowed to read that schema's subject, any other 4xx but :data:`NOT_ABOUT_THE_ID`), so the id's
    records are bad records; None when it must fail the batch (5xx, a refused request)."""
    if 400 <= status < 500 and status not in NOT_ABOUT_THE_ID:
        return LookupError(f"the schema registry answered HTTP {status} for id {schema_id}: {message}")
    return None


def registry_lookup(config: Mapping[str, Any]) -> Callable[[int], str]:
    """A function from a schema id to its Avro schema (JSON text); ``LookupError`` for an id the registry does not
    give (see the module docstring).

    :param config: ``SchemaRegistryClient`` config (``url``, ``basic.auth.user.info``, ``ssl.*``).
    """
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.error import SchemaRegistryError
    except ImportError as exc:
        raise ConfigurationError("schema_registry_conn_id needs confluent-kafka's schema registry client: "
                                 f"pip install 'airflow-eo[schema-registry]' ({exc})") from exc
    client = SchemaRegistryClient(dict(config))  # caches the schemas it found, by id, for the task's batches

    def lookup(schema_id: int) -> str:
        try:
            schema = client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            refusal = refusal_for_id(schema_id, exc.http_status_code, exc.error_message)
            if refusal is None:
                raise
            raise refusal from exc
        if (schema.schema_type or "AVRO") != "AVRO":
            raise LookupError(f"id {schema_id} is a {schema.schema_type} schema in the schema registry, not Avro")
        return str(schema.schema_str)

    return lookup
