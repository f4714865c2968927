"""Sink specifications a DAG declares (validated at DAG parse time, no I/O here).

At run time the operator resolves a spec into its adapter with the spec's Airflow
connection (see :mod:`airflow_eo.hooks`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import quote_table, validate_identifier
from airflow_eo.core.sql import check_updates


class SinkSpec:
    """Base of every sink spec: where output goes and how it becomes visible."""

    kind: str = ""
    #: output stays invisible until the batch commits (XA, Kafka transactions)
    transactional: bool = False
    conn_id: str

    @property
    def replay_safe(self) -> bool:
        """True when running a batch twice leaves the same result (interval-mode replays need it)."""
        return False


@dataclass(frozen=True)
class MySqlUpsertSink(SinkSpec):
    """``INSERT .. ON DUPLICATE KEY UPDATE`` with overwrite semantics, replay-safe.

    Each Spark task commits its own statements; the store's commit point follows. A
    crash replays the batch and rewrites the same rows, so only overwriting updates
    are allowed (an accumulating ``add`` is refused here, at DAG parse time).

    :param table: target table (``table`` or ``database.table``); must exist with a
        PRIMARY KEY / UNIQUE index on exactly ``key_columns``.
    :param key_columns: the upsert key.
    :param conn_id: Airflow ``mysql`` connection of the target database.
    :param updates: per non-key column, ``"replace"`` (default).
    :param rows_per_statement: rows per multi-row INSERT.
    :param dead_letter_table: where ``on_bad_record="dead_letter"`` writes bad records.
    """

    table: str
    key_columns: Sequence[str]
    conn_id: str = "mysql_default"
    updates: Mapping[str, str] = field(default_factory=dict)
    rows_per_statement: int = 500
    dead_letter_table: str = "eo_dead_letter"

    kind = "mysql_upsert"
    transactional = False

    def __post_init__(self) -> None:
        quote_table(self.table)
        quote_table(self.dead_letter_table)
        if not self.key_columns or isinstance(self.key_columns, str):
            raise ConfigurationError(f"{type(self).__name__}: key_columns must be a non-empty list of column names")
        object.__setattr__(self, "key_columns", tuple(self.key_columns))
        for key in self.key_columns:
            validate_identifier(key, "key column")
        check_updates(self.updates, replay_safe_only=not self.transactional, sink_name=type(self).__name__)
        if self.rows_per_statement < 1:
            raise ConfigurationError(f"{type(self).__name__}: rows_per_statement must be >= 1")

    @property
    def replay_safe(self) -> bool:
        return all(mode == "replace" for mode in self.updates.values())


@dataclass(frozen=True)
class MySqlXaSink(MySqlUpsertSink):
    """XA two-phase commit: nothing visible until the store's commit point; all or nothing per batch.

    Allows accumulating updates, e.g. ``updates={"pv": "add"}`` → ``pv = pv + new.pv``.
    Needs MariaDB >= 10.5 or MySQL >= 5.7.7 (prepared branches survive disconnects) and,
    on MySQL 8, the ``XA_RECOVER_ADMIN`` privilege.
    """

    kind = "mysql_xa"
    transactional = True


@dataclass(frozen=True)
class KafkaTransactionalSink(SinkSpec):
    """Append the output to a Kafka topic inside one Kafka transaction that also commits the offsets.

    The producer's ``transactional.id`` is stable per pipeline (``airflow_eo.<pipeline_id>``),
    so a newer attempt fences any older one; the consumed offsets go into the same
    transaction for the consumer group ``airflow_eo.<pipeline_id>``. Consumers of the output
    read with ``isolation.level=read_committed``. The transform's output needs the columns
    ``key_column`` and ``value_column`` (string or binary).

    :param topic: output topic (must exist).
    :param conn_id: Airflow ``kafka`` connection of the output cluster.
    :param transaction_timeout_ms: longest a batch's transaction may stay open; must not exceed
        the broker's ``transaction.max.timeout.ms`` (checked before any side effect).
    """

    topic: str
    conn_id: str = "kafka_default"
    key_column: str = "key"
    value_column: str = "value"
    transaction_timeout_ms: int = 600_000

    kind = "kafka_transactional"
    transactional = True

    def __post_init__(self) -> None:
        if not self.topic or not isinstance(self.topic, str):
            raise ConfigurationError("KafkaTransactionalSink: topic must name the output topic")
        for column in (self.key_column, self.value_column):
            validate_identifier(column, "column name")
        if not 1_000 <= self.transaction_timeout_ms <= 3_600_000:
            raise ConfigurationError("KafkaTransactionalSink: transaction_timeout_ms must be 1000..3600000")
