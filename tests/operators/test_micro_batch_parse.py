"""What the operator refuses at DAG parse time (no stack needed)."""

from datetime import datetime, timedelta

import pytest
from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, CronTriggerTimetable

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import validate_pipeline_id
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.operators.micro_batch import declared_sink_outlet, sink_asset_alias
from airflow_eo.sinks import KafkaTransactionalSink, MySqlUpsertSink, MySqlXaSink

UPSERT = MySqlUpsertSink(table="t", key_columns=["id"])


def op(**kwargs):
    defaults = {"task_id": "mb", "topics": ["t"], "value_format": "string", "sink": UPSERT}
    return KafkaMicroBatchOperator(**{**defaults, **kwargs})


@pytest.mark.parametrize("sink", [MySqlXaSink(table="t", key_columns=["id"], updates={"n": "add"}),
                                  MySqlXaSink(table="t", key_columns=["id"]),
                                  KafkaTransactionalSink(topic="out")])
def test_interval_mode_refuses_sinks_a_replay_would_double_count(sink):
    with pytest.raises(ConfigurationError, match="replay-safe sink, MySqlUpsertSink"):
        op(mode="interval", sink=sink)


def test_interval_mode_refuses_a_record_cap_and_unknown_modes():
    with pytest.raises(ConfigurationError, match="drop max_records_per_run"):
        op(mode="interval", max_records_per_run=10)
    with pytest.raises(ConfigurationError, match="supported modes are continuous, interval"):
        op(mode="hourly")


def test_interval_mode_refuses_a_schedule_with_zero_length_intervals():
    with DAG("zero", schedule="@hourly", start_date=datetime(2026, 1, 1)):
        with pytest.raises(ConfigurationError, match="CronDataIntervalTimetable"):
            op(mode="interval")
    with DAG("hourly", schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"), start_date=datetime(2026, 1, 1)):
        op(mode="interval")
    with DAG("trigger_with_interval", schedule=CronTriggerTimetable("@hourly", timezone="UTC",
                                                                    interval=timedelta(hours=1)),
             start_date=datetime(2026, 1, 1)):
        op(mode="interval")


def test_interval_mode_refuses_runs_started_by_asset_events_which_have_no_data_interval():
    from airflow.sdk import Asset, AssetOrTimeSchedule, AssetWatcher

    from airflow_eo.triggers.events import EoBacklogTrigger

    backlog = Asset("backlog", watchers=[AssetWatcher(name="backlog", trigger=EoBacklogTrigger("p", ["t"]))])
    schedules = [[backlog], AssetOrTimeSchedule(timetable=CronTriggerTimetable("@hourly", timezone="UTC"),
                                                assets=[backlog])]
    for number, schedule in enumerate(schedules):
        with DAG(f"on_events_{number}", schedule=schedule, start_date=datetime(2026, 1, 1)):
            with pytest.raises(ConfigurationError, match="asset events .* have none.*mode='continuous'"):
                op(mode="interval")
            assert op(task_id="continuous").mode.value == "continuous"  # runs when data arrives


def test_the_operator_declares_its_sink_asset_alias_as_outlet():
    with DAG("reuse", schedule=None, start_date=datetime(2026, 1, 1)):
        task = op(task_id="store")
    assert sink_asset_alias("reuse", "store") in task.outlets
    assert sink_asset_alias("reuse", "store").name == "airflow_eo:reuse.store"


def test_a_declared_outlet_with_the_sinks_uri_takes_the_event_instead_of_the_alias():
    uri = "mysql://127.0.0.1:23306/airflow_eo/page_views"
    with DAG("declared", schedule=None, start_date=datetime(2026, 1, 1)):
        declared = op(task_id="declared", outlets=[Asset("file:///elsewhere"), Asset(uri)])
        undeclared = op(task_id="undeclared", outlets=[Asset("mysql://127.0.0.1:23306/airflow_eo/other")])
    assert declared_sink_outlet(declared.outlets, uri) == Asset(uri)
    assert sink_asset_alias("declared", "declared") in declared.outlets  # kept: a sink whose URI differs
    assert declared_sink_outlet(undeclared.outlets, uri) is None


def test_a_continuous_task_runs_one_instance_at_a_time_unless_told_otherwise():
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("one_at_a_time", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        continuous = op(task_id="continuous")
        chosen = op(task_id="chosen", max_active_tis_per_dag=4)
        hourly = op(task_id="hourly", mode="interval")
    with DAG("from_defaults", schedule=None, start_date=datetime(2026, 1, 1),
             default_args={"max_active_tis_per_dag": 3}):
        defaulted = op(task_id="defaulted")
    assert (continuous.max_active_tis_per_dag, chosen.max_active_tis_per_dag) == (1, 4)
    assert hourly.max_active_tis_per_dag is None  # intervals are fenced apart and may run side by side
    assert defaulted.max_active_tis_per_dag == 3
    # What the scheduler sees: the serialized DAG keeps the limit.
    serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert serialized.get_task("continuous").max_active_tis_per_dag == 1


def test_idle_partition_timeout_is_an_interval_mode_duration():
    assert op(mode="interval", idle_partition_timeout=90).idle_partition_timeout == timedelta(seconds=90)
    assert op(mode="interval", idle_partition_timeout=timedelta(minutes=5)).idle_partition_timeout == timedelta(
        minutes=5)
    with pytest.raises(ConfigurationError, match="for mode='interval' only"):
        op(idle_partition_timeout=60)
    with pytest.raises(ConfigurationError, match="must not be negative"):
        op(mode="interval", idle_partition_timeout=-1)


ORDER = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}'


def test_formats_refuse_what_they_cannot_decode(tmp_path):
    with pytest.raises(ConfigurationError, match="value_format='avro' needs avro_schema="):
        op(value_format="avro", framing="none")
    with pytest.raises(ConfigurationError, match="framing='confluent'.*or framing='none'.*cannot tell them apart"):
        op(value_format="avro", avro_schema=ORDER)
    with pytest.raises(ConfigurationError, match="supported framings are none, confluent"):
        op(value_format="avro", avro_schema=ORDER, framing="guess")
    with pytest.raises(ConfigurationError, match="must be an Avro record"):
        op(value_format="avro", avro_schema='"string"', framing="none")
    with pytest.raises(ConfigurationError, match="neither Avro schema JSON nor a readable file"):
        op(value_format="avro", avro_schema=str(tmp_path / "missing.avsc"), framing="none")
    with pytest.raises(ConfigurationError, match="reserved by airflow_eo"):
        op(value_format="avro", avro_schema=ORDER.replace('"id"', '"_eo_decoded"'), framing="none")
    with pytest.raises(ConfigurationError, match="with framing='none' every record is written with the reader"):
        op(value_format="avro", avro_schema=ORDER, framing="none", writer_schemas={1: ORDER})
    (tmp_path / "v1.avsc").write_text(ORDER)
    with pytest.raises(ConfigurationError, match=r"\['v1'\] are not schema ids"):
        op(value_format="avro", avro_schema=ORDER, framing="confluent", writer_schemas=str(tmp_path))
    with pytest.raises(ConfigurationError, match="key_format='json' needs key_schema="):
        op(key_format="json")
    with pytest.raises(ConfigurationError, match="key_schema is for key_format='json' or 'avro'"):
        op(key_format="string", key_schema="id STRING")
    with pytest.raises(ConfigurationError, match="framing='confluent' needs the writer schemas of its ids"):
        op(value_format="avro", avro_schema=ORDER, framing="confluent")
    with pytest.raises(ConfigurationError, match="schema_registry_conn_id resolves the schema ids"):
        op(value_format="avro", avro_schema=ORDER, framing="none", schema_registry_conn_id="registry")


def test_avro_schemas_load_from_files_and_directories(tmp_path):
    (tmp_path / "order.avsc").write_text(ORDER)
    writers = tmp_path / "writers"
    writers.mkdir()
    (writers / "7.avsc").write_text(ORDER)
    task = op(value_format="avro", avro_schema=str(tmp_path / "order.avsc"), framing="confluent",
              writer_schemas=str(writers), key_format="avro", key_schema=ORDER)
    parse = task._parse_config(task.value_format, None, task.on_bad_record, None)
    compact = '{"type":"record","name":"Order","fields":[{"name":"id","type":"string"}]}'
    assert parse.avro_schema == parse.key_schema == compact
    assert dict(parse.writer_schema_map) == {7: parse.avro_schema}


def test_a_pipeline_id_the_store_would_cut_or_a_shell_would_read_differently_is_refused():
    """The store's column holds 190 characters (a longer id was cut by INSERT IGNORE and the run then failed with
    a TypeError); the operations paste ids into suggested shell commands and SQL."""
    for bad in ("p" * 191, "", "orders; DROP TABLE eo_batch", "it's", "a b", "päge", "$(id)", "x\n"):
        with pytest.raises(ConfigurationError, match="invalid pipeline_id"):
            op(pipeline_id=bad)
    for good in ("p" * 190, "page_views.v2-eu+orders", "{{ params.topic }}_hourly"):  # templated: checked rendered
        assert op(pipeline_id=good).pipeline_id == good
    # A rendered or default ("<dag_id>.<task_id>", up to 500 characters) id is checked when the task runs.
    assert validate_pipeline_id("dag.task") == "dag.task"
    with pytest.raises(ConfigurationError, match="1 to 190 letters"):
        validate_pipeline_id(f"{'d' * 150}.{'t' * 50}")


def test_dedup_key_is_taken_by_the_sql_sinks_and_refused_where_it_cannot_commit_with_the_output():
    task = op(value_format="json", schema="event_id STRING", dedup_key="event_id", dedup_retention=timedelta(hours=6))
    assert task.dedup_key == ("event_id",) and task.dedup_retention == timedelta(hours=6)
    with pytest.raises(ConfigurationError, match="KafkaTransactionalSink has no table to keep them in"):
        op(sink=KafkaTransactionalSink(topic="out"), dedup_key=["event_id"])
    with pytest.raises(ConfigurationError, match="dedup_key with mode='interval'"):
        op(mode="interval", dedup_key=["event_id"])
    with pytest.raises(ConfigurationError, match="dedup_retention must be a positive timedelta"):
        op(dedup_key=["event_id"], dedup_retention=timedelta(0))


def test_history_retention_is_a_duration_of_at_least_a_day():
    from airflow_eo.operators.after_commit import retention_seconds

    assert retention_seconds("90d") == 90 * 86400
    assert retention_seconds(timedelta(days=2)) == 2 * 86400
    assert retention_seconds(86400) == 86400
    assert retention_seconds(None) is None and retention_seconds("") is None
    assert op(history_retention="30d").history_retention == "30d"
    for bad, said in (("2h", "shorter than a day"), ("soon", "not a duration"), (timedelta(minutes=5), "a day")):
        with pytest.raises(ConfigurationError, match=said) as refused:
            op(history_retention=bad)
        assert "history_retention" in str(refused.value)
