"""The micro-batch operator: one DAG run = one exactly-once Kafka → Spark → sink batch."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow.sdk.log import mask_secret

from airflow_eo import CONFIG_SECTION, DEFAULT_OFFSET_STORE_CONN_ID
from airflow_eo.core.batch import Owner, RunRequest
from airflow_eo.core.changes import ChangeFormat, TruncatePolicy, check_changes
from airflow_eo.core.config import (
    BadRecordPolicy,
    Framing,
    KeyFormat,
    Mode,
    ParseConfig,
    ValueFormat,
    check_pipeline,
    choice,
)
from airflow_eo.core.dedup import DEFAULT_RETENTION
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_pipeline_id, validate_topic
from airflow_eo.core.lineage_names import LineageDataset
from airflow_eo.core.planning import Interval
from airflow_eo.core.protocol import run_batch
from airflow_eo.core.spark_conf import with_sink_spark_conf
from airflow_eo.hooks.connected_sinks import build_sink, sink_lineage
from airflow_eo.hooks.connected_sinks import sink_asset as sink_asset_of
from airflow_eo.hooks.kafka import KafkaClusterHook, schema_registry_lookup
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.hooks.spark import SparkSessionHook
from airflow_eo.kafka.offsets import parse_starting_offsets
from airflow_eo.operators.after_commit import emit_metrics, keep_history, mirror_group, retention_seconds
from airflow_eo.operators.schedules import check_timetable_has_intervals
from airflow_eo.sinks import SinkSpec
from airflow_eo.spark.changes import envelope_row
from airflow_eo.spark.engine import SparkBatchEngine
from airflow_eo.spark.kafka_security import secret_values, spark_kafka_options
from airflow_eo.spark.protobuf import load_descriptor_set, message_class, spark_schema

if TYPE_CHECKING:
    from airflow.sdk import Context


def sink_asset_alias(dag_id: str, task_id: str) -> AssetAlias:
    """The alias the operator declares as outlet; each committed batch adds its sink's Asset to it."""
    return AssetAlias(f"airflow_eo:{dag_id}.{task_id}")


def declared_sink_outlet(outlets: Sequence[Any], uri: str) -> Asset | None:
    """The sink's Asset when the DAG declares it among the task's outlets, else None.

    A declared Asset takes the batch's event instead of the alias: Airflow (3.3) links an alias to an asset
    at the alias's first event for it, and two runs whose batches commit at the same moment both insert
    that link; the API server then fails one task although its batch committed. A declared outlet is
    registered when the DAG is parsed and its events link nothing.
    """
    wanted = Asset(uri).uri  # the SDK normalises URIs: compare normalised forms
    return next((o for o in outlets if isinstance(o, Asset) and o.uri == wanted), None)


class KafkaMicroBatchOperator(BaseOperator):
    """Run one exactly-once micro-batch: planned Kafka offset ranges → Spark transform → sink.

    The batch's ranges are written to the offset store before any data is read; the
    output and the new offsets become visible together, once, whatever crashes,
    retries or clears happen (see ``airflow_eo/core/protocol.py``). A retry resumes
    the same batch; a cleared run that already committed returns its recorded summary.
    The return value (XCom) is the batch summary: pipeline, batch id, run id, ranges,
    records in, rows out, dead letters and seconds per phase.

    :param topics: Kafka topics to read. (templated)
    :param sink: a sink spec: :class:`~airflow_eo.sinks.MySqlUpsertSink` or :class:`~airflow_eo.sinks.MySqlXaSink`
        (MySQL / MariaDB), :class:`~airflow_eo.sinks.PostgresUpsertSink` or
        :class:`~airflow_eo.sinks.PostgresTwoPhaseSink` (PostgreSQL), or
        :class:`~airflow_eo.sinks.KafkaTransactionalSink` (a Kafka topic).
    :param pipeline_id: stable id of the pipeline in the offset store; default
        ``<dag_id>.<task_id>``, and ``<dag_id>.<task_id>.<topics>`` for a mapped task instance.
        One pipeline id belongs to one task: a second DAG or task declaring it is refused. At most 190
        letters, digits, ``.``, ``_``, ``-`` or ``+`` (checked at parse time; templated and default ids when the
        task runs). (templated)
    :param transform: ``(DataFrame, BatchContext) -> DataFrame`` callable, its dotted path,
        or Spark SQL over the ``kafka_batch`` view; None writes the parsed columns.
    :param value_format: ``json`` (with ``schema``), ``string``, ``bytes``, ``avro`` (with ``avro_schema`` and
        ``framing``) or ``protobuf`` (with ``protobuf_descriptor``, ``protobuf_message`` and ``framing``). See
        docs/how-to/topic-formats.md.
    :param schema: Spark DDL of JSON values; ``NOT NULL`` fields are required. (templated)
    :param key_format: ``bytes`` (default: the raw key in ``kafka_key`` only), ``string``, ``json`` (with
        ``key_schema`` as Spark DDL), ``avro`` (with ``key_schema`` as an Avro record schema, framed as the
        values) or ``protobuf`` (with ``protobuf_descriptor`` and ``key_protobuf_message``, framed as the values):
        parsed into the ``key`` column the transform sees (a STRING or a STRUCT; NULL for a record without a
        key). The transform also sees ``kafka_topic``, ``kafka_partition``, ``kafka_offset``,
        ``kafka_timestamp``, ``kafka_key`` (raw) and ``kafka_headers`` (ARRAY<STRUCT<key, value BINARY>>).
    :param key_schema: see ``key_format``.
    :param avro_schema: the Avro reader schema of ``value_format="avro"``: a record, as JSON text or a file path;
        its fields become the columns.
    :param protobuf_descriptor: ``value_format="protobuf"`` or ``key_format="protobuf"``: the path of a
        FileDescriptorSet file (as ``protoc --include_imports --descriptor_set_out`` writes it, and as Spark's
        ``from_protobuf`` takes it).
    :param protobuf_message: ``value_format="protobuf"``: the full name of the values' message (``shop.Order``); its
        fields become the columns (nested messages structs, repeated fields arrays, enums their names).
    :param key_protobuf_message: ``key_format="protobuf"``: the full name of the keys' message (``shop.OrderKey``)
        in ``protobuf_descriptor``; its fields are the ``key`` STRUCT's.
    :param framing: ``confluent`` (magic byte 0, a 4-byte schema id, the record: each record is decoded with its
        writer schema and resolved into the reader schema) or ``none`` (bare records written with the reader
        schema). Declared, never guessed from the first byte.
    :param writer_schemas: ``framing="confluent"``: writer schemas by id, a mapping ``{id: schema}`` (JSON text or
        a dict) or a directory of ``<id>.avsc`` files. A record with an id found nowhere is a bad record.
    :param schema_registry_conn_id: ``framing="confluent"``: a connection to a schema registry (host URL,
        login/password) asked for ids not in ``writer_schemas`` (needs ``airflow-eo[schema-registry]``).
    :param starting_offsets: where a partition never read before starts: ``earliest``,
        ``latest`` or a timestamp in epoch milliseconds.
    :param max_records_per_run: cap of offsets per batch, shared across partitions by lag.
    :param skip_lost_records: when records were deleted by retention before being read,
        skip them (recorded in the batch) instead of failing.
    :param on_bad_record: ``fail`` (default) or ``dead_letter``.
    :param dedup_key: columns of the parsed record (value or key columns) that identify an event: a record whose
        event was already seen (earlier in the batch, or by a committed batch within ``dedup_retention``) is a copy
        re-sent by an at-least-once producer and is dropped before the transform, counted as ``duplicates``. The ids
        are kept in the sink's database (``eo_seen_ids``), committed with the output. MySQL/MariaDB and PostgreSQL
        sinks, continuous mode (docs/how-to/duplicates.md).
    :param dedup_retention: how long, in record (Kafka timestamp) time, an event id is remembered; default 7 days.
    :param changes: ``"debezium"``: each value is a Debezium change event of a source table (JSON, with or without
        the converter's ``schema``/``payload`` wrapper; or Avro / Protobuf, ``value_format``, ``avro_schema`` or
        ``protobuf_message`` the envelope, and ``framing``) and ``schema`` is the row's columns (Spark DDL; Avro and
        Protobuf: by default the fields of the envelope's ``after``). A create,
        snapshot read or update writes its ``after`` image, a delete deletes the row of its ``before`` key; per key,
        the newest change by source position applies, and only when it is newer than the position recorded for the
        row (``eo_change_positions`` in the sink's database, committed with the output; a Delta / Iceberg table's
        ``_eo_change_position`` column, written by its commit; deletes leave a marker kept 7 days), so re-sent
        changes, re-snapshots and replays never roll a row back. Debezium's tombstones, heartbeats and transaction
        records are skipped. The upsert and table-format sinks with ``key_columns`` (the source's primary key),
        overwriting updates, continuous mode; a transform sees ``change_op`` and ``change_position`` and keeps them
        and the key (docs/change-data-capture.md).
    :param on_truncate: with ``changes``: ``"fail"`` (default): a truncate of the source table (Debezium's ``op`` t)
        is a bad record saying so; ``"truncate"``: the target's rows are deleted, once, and no change older than the
        truncate applies after it (MySQL / PostgreSQL upsert sinks).
    :param mode: ``continuous`` (each batch starts where the last one ended; a backfill run is
        one more ordinary batch) or ``interval`` (the batch is the run's data interval, found
        with ``offsets_for_times``; backfills and clears replay intervals, so only the upsert sinks,
        :class:`~airflow_eo.sinks.MySqlUpsertSink` and :class:`~airflow_eo.sinks.PostgresUpsertSink`, with
        overwriting updates are allowed).
    :param idle_partition_timeout: interval mode: how long after an interval's end a partition
        with no record at or after the end is taken as idle, its end closed at its last stable
        offset (``timedelta`` or seconds). Needs topics with ``message.timestamp.type=LogAppendTime``
        (later records are then stamped after the end); with producer timestamps such a partition
        keeps the interval waiting. None (default): every partition must move past the end.
    :param kafka_conn_id: Airflow ``kafka`` connection.
    :param offset_store_conn_id: Airflow ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of
        the offset store (its type chooses the database the store runs on).
    :param spark_conn_id: ``spark`` connection (host = master: ``spark://``, ``yarn``, ``k8s://``; client
        deploy mode) or ``spark_connect`` connection (a Spark Connect server); None or ``""`` runs
        ``local[*]`` inside the task. (templated: e.g. ``"{{ params.spark_conn_id }}"`` lets a run's conf
        choose the cluster)
    :param spark_conf: extra Spark conf.
    :param write_partitions: Spark tasks (connections, XA branches or prepared transactions) writing the output.
    :param history_retention: after each committed batch, a bounded share of the pipeline's history older than this
        goes (``airflow eo prune``'s rules, audited): ``timedelta``, seconds or ``"90d"``, at least a day. None (the
        default): ``[eo] history_retention``; empty there too: kept (docs/how-to/history.md).

    In continuous mode ``max_active_tis_per_dag`` defaults to 1: the scheduler then never runs
    two instances of the task at once, whatever their run types (``max_active_runs`` counts
    backfill runs apart from scheduled ones). Concurrent attempts would still be exactly-once,
    since the store fences the older one, but they would abort each other's batches and use up
    retries. Mapped tasks (``.partial().expand()``) do not get this default: pass it to
    ``partial`` if runs of the same mapped instance may overlap.
    """

    # transform is not templated: Airflow would call a callable template field with the context.
    template_fields: Sequence[str] = ("topics", "pipeline_id", "schema", "spark_conn_id")
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        topics: Sequence[str] | str,
        sink: SinkSpec,
        pipeline_id: str | None = None,
        transform: Callable[..., Any] | str | None = None,
        value_format: ValueFormat | str = ValueFormat.JSON,
        schema: str | None = None,
        starting_offsets: str | int = "earliest",
        max_records_per_run: int | None = None,
        skip_lost_records: bool = False,
        on_bad_record: BadRecordPolicy | str = BadRecordPolicy.FAIL,
        mode: Mode | str = Mode.CONTINUOUS,
        idle_partition_timeout: timedelta | float | None = None,
        kafka_conn_id: str = "kafka_default",
        offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID,
        spark_conn_id: str | None = None,
        spark_conf: Mapping[str, Any] | None = None,
        write_partitions: int | None = None,
        kafka_options: Mapping[str, str] | None = None,
        key_format: KeyFormat | str = KeyFormat.BYTES,
        key_schema: str | None = None,
        avro_schema: str | None = None,
        framing: Framing | str | None = None,
        writer_schemas: Mapping[int, Any] | str | None = None,
        schema_registry_conn_id: str | None = None,
        protobuf_descriptor: str | None = None,
        protobuf_message: str | None = None,
        key_protobuf_message: str | None = None,
        dedup_key: Sequence[str] | str | None = None,
        dedup_retention: timedelta = DEFAULT_RETENTION,
        changes: ChangeFormat | str | None = None,
        on_truncate: TruncatePolicy | str = TruncatePolicy.FAIL,
        history_retention: timedelta | float | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Everything below is checked at DAG parse time: a bad DAG never starts a batch.
        mode = choice(Mode, mode, "mode", "modes")
        if mode is Mode.CONTINUOUS and self.max_active_tis_per_dag is None:  # neither given nor in default_args
            self.max_active_tis_per_dag = 1  # one batch at a time; see the class docstring
        if not isinstance(sink, SinkSpec):
            raise ConfigurationError(f"sink must be a sink spec such as MySqlXaSink(...), not {type(sink).__name__}")
        if isinstance(idle_partition_timeout, int | float):
            idle_partition_timeout = timedelta(seconds=idle_partition_timeout)
        if idle_partition_timeout is not None and (mode is not Mode.INTERVAL or idle_partition_timeout < timedelta(0)):
            raise ConfigurationError("idle_partition_timeout is for mode='interval' only, and must not be negative "
                                     "(a timedelta or seconds; None waits for every partition)")
        self.key_format, self.key_schema, self.avro_schema = key_format, key_schema, avro_schema
        self.framing, self.writer_schemas = framing, writer_schemas
        self.schema_registry_conn_id = schema_registry_conn_id
        self.protobuf_descriptor, self.protobuf_message = protobuf_descriptor, protobuf_message
        self.key_protobuf_message = key_protobuf_message
        self.dedup_key = (dedup_key,) if isinstance(dedup_key, str) else tuple(dedup_key or ())
        self.dedup_retention = dedup_retention
        self.changes = check_changes(changes, sink_name=sink.name, takes_changes=sink.capabilities.takes_changes,
                                     key_columns=sink.row_key, accumulating=sink.accumulating,
                                     interval_mode=mode is Mode.INTERVAL, dedup_key=self.dedup_key,
                                     on_truncate=on_truncate, truncates=sink.capabilities.applies_changes)
        self.on_truncate = TruncatePolicy(on_truncate)
        self.sink = sink
        parse = self._parse_config(value_format, schema, on_bad_record, write_partitions)
        avro = parse.value_format is ValueFormat.AVRO or parse.key_format is KeyFormat.AVRO
        if schema_registry_conn_id and not (avro and parse.framing is Framing.CONFLUENT):
            raise ConfigurationError("schema_registry_conn_id resolves the schema ids of Avro with "
                                     "framing='confluent'")
        # Protobuf: the file, the messages and their Spark types, at parse time
        for option, message in (("protobuf_message", protobuf_message), ("key_protobuf_message", key_protobuf_message)):
            if message:  # ParseConfig checked that each comes with its format and the descriptor
                struct = spark_schema(message_class(load_descriptor_set(protobuf_descriptor or ""), message,
                                                    option).DESCRIPTOR)
                if self.changes is not None and option == "protobuf_message":  # the envelope (Avro: ParseConfig)
                    envelope_row(struct, None, option)
        if avro and parse.framing is Framing.CONFLUENT and not (parse.writer_schema_map or schema_registry_conn_id):
            raise ConfigurationError("framing='confluent' needs the writer schemas of its ids: writer_schemas= "
                                     "({id: schema} or a directory of <id>.avsc) or schema_registry_conn_id=")
        check_pipeline(sink, mode, parse, max_records_per_run, has_transform=transform is not None)
        if mode is Mode.INTERVAL and self.has_dag():
            check_timetable_has_intervals(self.dag.timetable, self.dag.dag_id)
        parse_starting_offsets(starting_offsets)
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise ConfigurationError("topics must name at least one Kafka topic")
        for topic in self.topics:
            if "{{" not in topic:  # a templated name is checked once rendered, when the task runs
                validate_topic(topic)
        self.sink = sink
        if pipeline_id is not None and "{{" not in pipeline_id:  # a templated id is checked once rendered
            validate_pipeline_id(pipeline_id)
        self.pipeline_id = pipeline_id  # None: "<dag_id>.<task_id>", resolved at run time
        self.transform = transform
        self.value_format = parse.value_format
        self.schema = schema  # templated: the rendered schema is parsed again when the task runs
        self.starting_offsets = starting_offsets
        self.max_records_per_run = max_records_per_run
        self.skip_lost_records = skip_lost_records
        self.on_bad_record = parse.on_bad_record
        self.mode = mode
        self.idle_partition_timeout = idle_partition_timeout
        self.kafka_conn_id = kafka_conn_id
        self.offset_store_conn_id = offset_store_conn_id
        self.spark_conn_id = spark_conn_id
        self.spark_conf = dict(spark_conf or {})
        self.write_partitions = write_partitions
        retention_seconds(history_retention)  # a bad value is refused at parse time
        self.history_retention = history_retention
        self.kafka_options = dict(kafka_options or {})
        spark_kafka_options({}, self.kafka_options)  # a secret in DAG code is refused at parse time
        self._engine: SparkBatchEngine | None = None
        self._lineage: tuple[str, LineageDataset] | None = None  # Kafka namespace, the sink's output
        self._run: tuple[str, str, Interval | None] | None = None  # pipeline id, run id, interval of this attempt
        self._summary: dict[str, Any] | None = None  # the committed batch's summary (the XCom)
        if self.has_dag():  # downstream DAGs schedule on the sink's Asset, added to this alias per batch
            self.outlets = [*self.outlets, sink_asset_alias(self.dag_id, self.task_id)]

    def execute(self, context: Context) -> dict[str, Any]:
        map_index = getattr(context.get("ti"), "map_index", -1)
        default_id = f"{self.dag_id}.{self.task_id}" + (f".{'+'.join(sorted(self.topics))}" if map_index >= 0 else "")
        pipeline_id = validate_pipeline_id(self.pipeline_id or default_id)
        interval = self._data_interval(context) if self.mode is Mode.INTERVAL else None
        kafka_hook = KafkaClusterHook(self.kafka_conn_id)
        kafka_config = kafka_hook.get_config()
        for secret in secret_values(spark_kafka_options(kafka_config, self.kafka_options)):
            mask_secret(secret)  # the JAAS line quotes the password: its own text must be masked too
        spark_hook = SparkSessionHook(self.spark_conn_id or None, with_sink_spark_conf(self.sink, self.spark_conf))
        refusal = self.sink.spark_connect_refusal() if spark_hook.is_connect() else None
        if refusal:
            raise ConfigurationError(refusal)
        self._engine = SparkBatchEngine(
            session_factory=spark_hook.get_conn,
            kafka_config=kafka_config,
            parse=self._parse_config(self.value_format, self.schema, self.on_bad_record, self.write_partitions),
            transform=self.transform,
            kafka_options=self.kafka_options,
            connect_early=spark_hook.is_connect(),
            schema_lookup=schema_registry_lookup(self.schema_registry_conn_id) if self.schema_registry_conn_id
            else None,
        )
        for topic in self.topics:
            validate_topic(topic)
        request = RunRequest(
            pipeline_id=pipeline_id,
            run_id=context["run_id"],
            topics=self.topics,
            starting_offsets=self.starting_offsets,
            max_records_per_run=self.max_records_per_run,
            skip_lost_records=self.skip_lost_records,
            interval=interval,
            idle_partition_timeout=self.idle_partition_timeout,
            owner=Owner(self.dag_id, self.task_id),
            sink=self.sink.record(),  # for `airflow eo`: the sink's kind, whether a rewind double counts
        )
        sink_asset = sink_asset_of(self.sink)
        bootstrap = str(kafka_config.get("bootstrap.servers", "")).split(",")[0]
        self._lineage = (f"kafka://{bootstrap}", sink_lineage(self.sink))
        self._run = (pipeline_id, context["run_id"], interval)
        store = OffsetStoreHook(self.offset_store_conn_id).get_store()
        sink = build_sink(self.sink, pipeline_id, self.offset_store_conn_id)
        try:
            summary = run_batch(request, store=store, source=kafka_hook.get_offset_source(), engine=self._engine,
                                sink=sink)
            committed = functools.cache(functools.partial(store.committed_offsets, summary.pipeline_id))  # read once
            emit_metrics(summary, committed, kafka_hook, self.mode, self.topics, self.starting_offsets, self.log)
            mirror_group(summary, committed, kafka_hook, self.mode, self.sink.record(), self.log)
            keep_history(summary, self._history_retention_s(), self.offset_store_conn_id, self.kafka_conn_id,
                         actor=f"{self.dag_id}.{self.task_id} (history_retention)", log=self.log)
        finally:
            # A task's process ends with os._exit: no at-exit handler ends the kept connections.
            store.close()
            sink.close()
        self.log.info(
            "pipeline %s batch %s: %s records in, %s rows out, %s dead letters, %s duplicates%s; seconds %s",
            summary.pipeline_id, summary.batch_id, summary.records_in, summary.rows_out, summary.dead_letters,
            summary.duplicates,
            " (already committed earlier)" if summary.already_committed else "", dict(summary.seconds),
        )
        result = self._summary = summary.to_dict()
        if "outlet_events" in context:
            extra = {k: result[k] for k in _ASSET_EXTRA_KEYS}
            declared = declared_sink_outlet(self.outlets, sink_asset.uri)
            if declared is not None:  # Airflow records its event on every success: say when nothing was done
                context["outlet_events"][declared].extra.update(extra, already_committed=summary.already_committed)
            elif not summary.already_committed:
                context["outlet_events"][sink_asset_alias(self.dag_id, self.task_id)].add(
                    Asset(sink_asset.uri), extra=extra)
        return result

    def _parse_config(self, value_format: Any, schema: str | None, on_bad_record: Any,
                      write_partitions: int | None) -> ParseConfig:
        # ParseConfig turns the option strings into their enums (and says which choices there are).
        return ParseConfig(value_format, schema, on_bad_record, write_partitions,
                           key_format=self.key_format,  # type: ignore[arg-type]
                           key_schema=self.key_schema, avro_schema=self.avro_schema,
                           framing=self.framing,  # type: ignore[arg-type]
                           writer_schemas=self.writer_schemas, protobuf_descriptor=self.protobuf_descriptor,
                           protobuf_message=self.protobuf_message, key_protobuf_message=self.key_protobuf_message,
                           delete_keys=self.sink.delete_keys, dedup_key=self.dedup_key,
                           dedup_retention=self.dedup_retention, changes=self.changes,
                           change_keys=self.sink.row_key if self.changes is not None else (),
                           on_truncate=self.on_truncate)

    def _history_retention_s(self) -> float | None:
        if self.history_retention is not None:
            return retention_seconds(self.history_retention)
        from airflow.configuration import conf

        return retention_seconds(conf.get(CONFIG_SECTION, "history_retention", fallback=""), "[eo] history_retention")

    def _data_interval(self, context: Context) -> Interval:
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        if start is None or end is None:
            raise ConfigurationError(
                f"mode='interval': run {context.get('run_id')!r} has no data interval (a manual or asset-triggered "
                "run without a logical date). Interval mode processes a run's data interval: run it on its "
                "schedule, as a backfill, or trigger it with a logical date; or use mode='continuous'."
            )
        return Interval(start, end)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage COMPLETE: the topics, the sink with the rows written, the batch (``operators/lineage.py``)."""
        from airflow_eo.operators import lineage

        if self._lineage is None or self._summary is None:
            from airflow.providers.openlineage.extractors import OperatorLineage

            return OperatorLineage()
        return lineage.completed(self._lineage[0], self.topics, self._lineage[1], self._summary)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """OpenLineage FAIL: where the store holds this run's batch (planned, prepared, aborted, or none)."""
        from airflow_eo.operators import lineage

        if self._lineage is None or self._run is None:
            from airflow.providers.openlineage.extractors import OperatorLineage

            return OperatorLineage()
        pipeline_id, run_id, interval = self._run
        try:
            store = OffsetStoreHook(self.offset_store_conn_id).get_store()
            batch = (store.batch_for_interval(pipeline_id, interval) if interval is not None
                     else store.batch_for_run(pipeline_id, run_id))
        except Exception:  # the store may be what failed: the event still goes out, without the batch
            self.log.warning("OpenLineage: could not read the failed run's batch from the offset store", exc_info=True)
            batch = None
        return lineage.failed(self._lineage[0], self.topics, self._lineage[1], pipeline_id, run_id, batch)

    def on_kill(self) -> None:
        if self._engine is not None:
            self._engine.cancel()


_ASSET_EXTRA_KEYS = ("pipeline_id", "batch_id", "run_id", "mode", "interval", "ranges", "records_in", "rows_out",
                     "replayed")
