"""Sink specifications a DAG declares: validated when the DAG is parsed, no I/O until run time.

Each spec turns itself into its run-time adapter (:meth:`SinkSpec.adapter`, an
implementation of :class:`airflow_eo.core.protocol.Sink`) and its Asset
(:meth:`SinkSpec.asset`) with its Airflow connection. A new sink is a new ``SinkSpec``
subclass and its adapter: the operator and the engine need no change
(``docs/architecture.md``, "Adding a sink").
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_eo.core.config import SinkRecord, UpdateMode, choice
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import quote_table, validate_identifier, validate_topic

if TYPE_CHECKING:
    from airflow_eo.core.protocol import Sink


@dataclass(frozen=True)
class SinkAsset:
    """Where a sink writes, in the URI scheme of Airflow's provider for that system (Assets, lineage)."""

    namespace: str  # e.g. mysql://host:port, kafka://bootstrap
    name: str  # e.g. database.table, topic

    @property
    def uri(self) -> str:
        return f"{self.namespace}/{self.name.replace('.', '/')}"


class SinkSpec(ABC):
    """Base of every sink spec: where output goes and how it becomes visible."""

    conn_id: str
    #: ``on_bad_record='dead_letter'`` is possible: the sink writes bad records with the batch.
    keeps_dead_letters: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def replay_safe(self) -> bool:
        """True when running a batch twice leaves the same result (interval-mode replays need it)."""
        return False

    @property
    def accumulating(self) -> bool:
        """True when processing a record twice changes the result (adds to a row, appends): a rewind that
        reprocesses offsets counts them twice."""
        return True

    @property
    def target(self) -> str:
        """The table or topic written."""
        return ""

    def record(self) -> SinkRecord:
        """What the offset store records of this sink at each take (``airflow eo`` reads it)."""
        options = {f.name: _json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return SinkRecord(kind=type(self).__name__, accumulating=self.accumulating, conn_id=self.conn_id,
                          target=self.target, dead_letter_table=options.get("dead_letter_table"), options=options)

    @abstractmethod
    def adapter(self, pipeline_id: str, offset_store_conn_id: str | None = None) -> Sink:
        """The run-time adapter of this sink for ``pipeline_id``, connected through ``conn_id``.

        :param offset_store_conn_id: the pipeline's offset store, for sinks whose writes are fenced by
            its epochs (an upsert sink on the store's server).
        """

    @abstractmethod
    def asset(self) -> SinkAsset:
        """The sink's Asset (each committed batch adds an event for it)."""


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
    :param updates: per non-key column, ``"replace"`` (default, ``c = new c``); the XA sink also
        allows ``"add"`` (``c = c + new c``).
    :param rows_per_statement: rows per multi-row INSERT.
    :param dead_letter_table: where ``on_bad_record="dead_letter"`` writes bad records.
    :param bulk_load: each Spark task loads its rows with ``LOAD DATA LOCAL INFILE`` (CSV files written by Arrow)
        into a session-private staging table, then writes them with one ``INSERT .. SELECT .. ON DUPLICATE KEY
        UPDATE``: the same rows and updates as the multi-row statements, several times faster. Used when the server
        allows it (``local_infile=ON``, MariaDB's default) and for columns of plain types; otherwise the
        statements. ``LOAD DATA LOCAL`` lets the server ask the writer for a local file: set False for a server
        you do not trust.
    """

    table: str
    key_columns: Sequence[str]
    conn_id: str = "mysql_default"
    updates: Mapping[str, UpdateMode | str] = field(default_factory=dict)
    rows_per_statement: int = 500
    dead_letter_table: str = "eo_dead_letter"
    bulk_load: bool = True

    keeps_dead_letters: ClassVar[bool] = True
    #: accumulating updates are safe only where a replay cannot apply them twice (XA)
    allows_accumulating: ClassVar[bool] = False

    def __post_init__(self) -> None:
        quote_table(self.table)
        quote_table(self.dead_letter_table)
        if not self.key_columns or isinstance(self.key_columns, str):
            raise ConfigurationError(f"{self.name}: key_columns must be a non-empty list of column names")
        object.__setattr__(self, "key_columns", tuple(self.key_columns))
        for key in self.key_columns:
            validate_identifier(key, "key column")
        updates = {}
        for column, mode in self.updates.items():
            validate_identifier(column, "column name")
            updates[column] = choice(UpdateMode, mode, f"{self.name}: update mode of column {column!r}",
                                     "update modes")
            if updates[column] is UpdateMode.ADD and not self.allows_accumulating:
                raise ConfigurationError(
                    f"{self.name}: column {column!r} uses an accumulating update ('add'), which counts a "
                    "record twice when a batch is replayed after a crash. The upsert sink only overwrites; "
                    "use MySqlXaSink for accumulating updates (its writes commit atomically with the offsets)."
                )
        object.__setattr__(self, "updates", updates)
        if self.rows_per_statement < 1:
            raise ConfigurationError(f"{self.name}: rows_per_statement must be >= 1")

    @property
    def replay_safe(self) -> bool:
        return not self.allows_accumulating and all(m is UpdateMode.REPLACE for m in self.updates.values())

    @property
    def accumulating(self) -> bool:
        return any(m is UpdateMode.ADD for m in self.updates.values())

    @property
    def target(self) -> str:
        return self.table

    def adapter(self, pipeline_id: str, offset_store_conn_id: str | None = None) -> Sink:
        from airflow_eo.hooks.mysql import EoMySqlHook, OffsetStoreHook
        from airflow_eo.mysql.sink import MySqlUpsertAdapter

        store = OffsetStoreHook(offset_store_conn_id).get_connect_kwargs() if offset_store_conn_id else None
        return MySqlUpsertAdapter(self, EoMySqlHook(self.conn_id).get_connect_kwargs(), store)

    def asset(self) -> SinkAsset:
        """``mysql://host:port/database/table``, the scheme of Airflow's MySQL provider."""
        from airflow_eo.hooks.mysql import EoMySqlHook

        db = EoMySqlHook(self.conn_id).get_connect_kwargs()
        database, _, table = self.table.rpartition(".")
        return SinkAsset(f"mysql://{db['host']}:{db['port']}", f"{database or db['database']}.{table}")


@dataclass(frozen=True)
class MySqlXaSink(MySqlUpsertSink):
    """XA two-phase commit: nothing visible until the store's commit point; all or nothing per batch.

    Allows accumulating updates, e.g. ``updates={"pv": "add"}`` → ``pv = pv + new.pv``.
    Needs MariaDB >= 10.5 or MySQL >= 5.7.7 (prepared branches survive disconnects) and,
    on MySQL 8, the ``XA_RECOVER_ADMIN`` privilege.
    """

    allows_accumulating: ClassVar[bool] = True

    def adapter(self, pipeline_id: str, offset_store_conn_id: str | None = None) -> Sink:
        # Prepared branches of an older attempt are never committed: no epoch fence needed.
        from airflow_eo.hooks.mysql import EoMySqlHook
        from airflow_eo.mysql.sink import MySqlXaAdapter

        return MySqlXaAdapter(self, EoMySqlHook(self.conn_id).get_connect_kwargs())


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

    def __post_init__(self) -> None:
        if not self.topic or not isinstance(self.topic, str):
            raise ConfigurationError("KafkaTransactionalSink: topic must name the output topic")
        validate_topic(self.topic, "KafkaTransactionalSink: output topic")
        for column in (self.key_column, self.value_column):
            validate_identifier(column, "column name")
        if not 1_000 <= self.transaction_timeout_ms <= 3_600_000:
            raise ConfigurationError("KafkaTransactionalSink: transaction_timeout_ms must be 1000..3600000")

    @property
    def target(self) -> str:
        return self.topic

    def adapter(self, pipeline_id: str, offset_store_conn_id: str | None = None) -> Sink:
        # init_transactions fences an older attempt's producer: no store epoch needed.
        from airflow_eo.hooks.kafka import KafkaClusterHook
        from airflow_eo.kafka.sink import KafkaTransactionalAdapter

        return KafkaTransactionalAdapter(self, KafkaClusterHook(self.conn_id).get_config(), pipeline_id)

    def asset(self) -> SinkAsset:
        """``kafka://bootstrap/topic``, the scheme of Airflow's Kafka provider."""
        from airflow_eo.hooks.kafka import KafkaClusterHook

        bootstrap = str(KafkaClusterHook(self.conn_id).get_config().get("bootstrap.servers", ""))
        return SinkAsset(f"kafka://{bootstrap.split(',')[0]}", self.topic)


#: The sink specs ``airflow eo`` can rebuild from what the store recorded (:func:`spec_from_record`).
SINK_KINDS: dict[str, type[SinkSpec]] = {cls.__name__: cls for cls in (MySqlUpsertSink, MySqlXaSink,
                                                                         KafkaTransactionalSink)}


def spec_from_record(record: SinkRecord, conn_id: str | None = None) -> SinkSpec:
    """The sink spec the store recorded (validated again), e.g. to run its adapter's recovery outside the DAG.

    :param record: what the store recorded at the pipeline's last take.
    :param conn_id: another Airflow connection of the same sink (default: the recorded one).
    """
    cls = SINK_KINDS.get(record.kind)
    if cls is None:
        raise ConfigurationError(f"sink kind {record.kind!r} is not one airflow_eo can rebuild "
                                 f"({', '.join(SINK_KINDS)}); its pipeline's next run recovers it")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    options = {k: v for k, v in record.options.items() if k in names}
    if conn_id:
        options["conn_id"] = conn_id
    return cls(**options)


def _json_value(value: Any) -> Any:
    """A spec field as a JSON value (tuples as lists, enums as their values)."""
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, UpdateMode):
        return value.value
    return value
