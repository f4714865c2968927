"""The micro-batch operator: one DAG run = one exactly-once Kafka → Spark → sink batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_eo.adapters.kafka_offsets import parse_starting_offsets
from airflow_eo.adapters.spark_engine import BAD_RECORD_POLICIES, VALUE_FORMATS, SparkBatchEngine
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.protocol import RunRequest, run_batch
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.mysql import EoMySqlHook, OffsetStoreHook
from airflow_eo.hooks.spark import SparkSessionHook
from airflow_eo.sinks import KafkaTransactionalSink, MySqlUpsertSink, SinkSpec

if TYPE_CHECKING:
    from airflow.sdk import Context

MODES = ("continuous",)


class KafkaMicroBatchOperator(BaseOperator):
    """Run one exactly-once micro-batch: planned Kafka offset ranges → Spark transform → sink.

    The batch's ranges are written to the offset store before any data is read; the
    output and the new offsets become visible together, once, whatever crashes,
    retries or clears happen (see ``airflow_eo/core/protocol.py``). A retry resumes
    the same batch; a cleared run that already committed returns its recorded summary.
    The return value (XCom) is the batch summary: pipeline, batch id, run id, ranges,
    records in, rows out, dead letters and seconds per phase.

    :param topics: Kafka topics to read. (templated)
    :param sink: a sink spec: :class:`~airflow_eo.sinks.MySqlUpsertSink`,
        :class:`~airflow_eo.sinks.MySqlXaSink` or :class:`~airflow_eo.sinks.KafkaTransactionalSink`.
    :param pipeline_id: stable id of the pipeline in the offset store; default
        ``<dag_id>.<task_id>``. (templated)
    :param transform: ``(DataFrame, BatchContext) -> DataFrame`` callable, its dotted path,
        or Spark SQL over the ``kafka_batch`` view; None writes the parsed columns.
    :param value_format: ``json`` (with ``schema``), ``string`` or ``bytes``.
    :param schema: Spark DDL of JSON values; ``NOT NULL`` fields are required. (templated)
    :param starting_offsets: where a partition never read before starts: ``earliest``,
        ``latest`` or a timestamp in epoch milliseconds.
    :param max_records_per_run: cap of offsets per batch, shared across partitions by lag.
    :param skip_lost_records: when records were deleted by retention before being read,
        skip them (recorded in the batch) instead of failing.
    :param on_bad_record: ``fail`` (default) or ``dead_letter``.
    :param mode: ``continuous`` (each batch starts where the last one ended).
    :param kafka_conn_id: Airflow ``kafka`` connection.
    :param offset_store_conn_id: Airflow ``mysql`` connection of the offset store.
    :param spark_conn_id: ``spark`` / ``spark_connect`` connection; None runs ``local[*]``.
    :param spark_conf: extra Spark conf.
    :param write_partitions: Spark tasks (connections, XA branches) writing the output.
    """

    # transform is not templated: Airflow would call a callable template field with the context.
    template_fields: Sequence[str] = ("topics", "pipeline_id", "schema")
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        topics: Sequence[str] | str,
        sink: SinkSpec,
        pipeline_id: str | None = None,
        transform: Callable[..., Any] | str | None = None,
        value_format: str = "json",
        schema: str | None = None,
        starting_offsets: str | int = "earliest",
        max_records_per_run: int | None = None,
        skip_lost_records: bool = False,
        on_bad_record: str = "fail",
        mode: str = "continuous",
        kafka_conn_id: str = "kafka_default",
        offset_store_conn_id: str = "eo_offset_store",
        spark_conn_id: str | None = None,
        spark_conf: Mapping[str, Any] | None = None,
        write_partitions: int | None = None,
        kafka_options: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Everything below is checked at DAG parse time: a bad DAG never starts a batch.
        if mode not in MODES:
            raise ConfigurationError(f"mode={mode!r}: supported modes are {', '.join(MODES)}")
        if not isinstance(sink, SinkSpec):
            raise ConfigurationError(f"sink must be a sink spec such as MySqlXaSink(...), not {type(sink).__name__}")
        if isinstance(sink, KafkaTransactionalSink) and on_bad_record != "fail":
            raise ConfigurationError("KafkaTransactionalSink supports on_bad_record='fail' only (no dead-letter table)")
        if value_format not in VALUE_FORMATS:
            raise ConfigurationError(f"value_format={value_format!r}: use one of {', '.join(VALUE_FORMATS)}")
        if value_format == "json" and not schema:
            raise ConfigurationError("value_format='json' needs schema= (Spark DDL, e.g. 'id STRING NOT NULL, n INT')")
        if on_bad_record not in BAD_RECORD_POLICIES:
            raise ConfigurationError(f"on_bad_record={on_bad_record!r}: use one of {', '.join(BAD_RECORD_POLICIES)}")
        if max_records_per_run is not None and max_records_per_run < 1:
            raise ConfigurationError("max_records_per_run must be a positive number of records (or None)")
        parse_starting_offsets(starting_offsets)
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise ConfigurationError("topics must name at least one Kafka topic")
        self.sink = sink
        self.pipeline_id = pipeline_id  # None: "<dag_id>.<task_id>", resolved at run time
        self.transform = transform
        self.value_format = value_format
        self.schema = schema
        self.starting_offsets = starting_offsets
        self.max_records_per_run = max_records_per_run
        self.skip_lost_records = skip_lost_records
        self.on_bad_record = on_bad_record
        self.mode = mode
        self.kafka_conn_id = kafka_conn_id
        self.offset_store_conn_id = offset_store_conn_id
        self.spark_conn_id = spark_conn_id
        self.spark_conf = dict(spark_conf or {})
        self.write_partitions = write_partitions
        self.kafka_options = dict(kafka_options or {})
        self._engine: SparkBatchEngine | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        pipeline_id = self.pipeline_id or f"{self.dag_id}.{self.task_id}"
        kafka_hook = KafkaClusterHook(self.kafka_conn_id)
        kafka_config = kafka_hook.get_config()
        spark_hook = SparkSessionHook(self.spark_conn_id, self.spark_conf)
        self._engine = SparkBatchEngine(
            session_factory=spark_hook.get_conn,
            kafka_config=kafka_config,
            value_format=self.value_format,
            schema=self.schema,
            transform=self.transform,
            on_bad_record=self.on_bad_record,
            write_partitions=self.write_partitions,
            kafka_options=self.kafka_options,
        )
        request = RunRequest(
            pipeline_id=pipeline_id,
            run_id=context["run_id"],
            topics=self.topics,
            starting_offsets=self.starting_offsets,
            max_records_per_run=self.max_records_per_run,
            skip_lost_records=self.skip_lost_records,
        )
        summary = run_batch(
            request,
            store=OffsetStoreHook(self.offset_store_conn_id).get_store(),
            source=kafka_hook.get_offset_source(),
            engine=self._engine,
            sink=self._sink_adapter(pipeline_id),
        )
        self.log.info(
            "pipeline %s batch %s: %s records in, %s rows out, %s dead letters%s; seconds %s",
            summary.get("pipeline_id"), summary.get("batch_id"), summary.get("records_in"), summary.get("rows_out"),
            summary.get("dead_letters"), " (already committed earlier)" if summary.get("already_committed") else "",
            summary.get("seconds"),
        )
        return summary

    def _sink_adapter(self, pipeline_id: str):
        if isinstance(self.sink, KafkaTransactionalSink):
            return KafkaClusterHook(self.sink.conn_id).get_sink_adapter(self.sink, pipeline_id)
        assert isinstance(self.sink, MySqlUpsertSink)
        return EoMySqlHook(self.sink.conn_id).get_sink_adapter(self.sink)

    def on_kill(self) -> None:
        if self._engine is not None:
            self._engine.cancel()
