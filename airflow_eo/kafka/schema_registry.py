"""Writer schemas by id from a Confluent schema registry: a thin use of confluent-kafka's ``SchemaRegistryClient``.

Optional: the client needs confluent-kafka's ``schemaregistry`` extra (``pip install 'airflow-eo[schema-registry]'``).
No registry server runs in this project's tests: the supplied-schemas path (``writer_schemas``) is the tested one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_eo.core.errors import ConfigurationError

NOT_FOUND = 404


def registry_lookup(config: Mapping[str, Any]) -> Callable[[int], str | None]:
    """A function from a schema id to its Avro schema (JSON text), None for an id the registry does not know.

    :param config: ``SchemaRegistryClient`` config (``url``, ``basic.auth.user.info``, ``ssl.*``).
    """
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.error import SchemaRegistryError
    except ImportError as exc:
        raise ConfigurationError("schema_registry_conn_id needs confluent-kafka's schema registry client: "
                                 f"pip install 'airflow-eo[schema-registry]' ({exc})") from exc
    client = SchemaRegistryClient(dict(config))

    def lookup(schema_id: int) -> str | None:
        try:
            schema = client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == NOT_FOUND:
                return None
            raise
        if (schema.schema_type or "AVRO") != "AVRO":
            return None  # a Protobuf or JSON schema under this id: not a writer schema of an Avro record
        return str(schema.schema_str)

    return lookup
