"""Objects that hold connection secrets never show them in their repr (a log line, an error, a debugger)."""

from __future__ import annotations

from airflow_eo.core.config import ParseConfig, ValueFormat
from airflow_eo.core.connections import ConnectionInfo
from airflow_eo.mysql.writer import PartitionWriter
from airflow_eo.spark.engine import SparkBatchEngine

SECRET = "s3cr3t-Pa55"


def test_no_repr_shows_a_password_sasl_credentials_or_a_jaas_config():
    writer = PartitionWriter(connect_kwargs={"host": "db", "user": "eo", "password": SECRET}, table="t",
                             columns=("id",), key_columns=("id",), updates={}, row_alias=False,
                             rows_per_statement=100, xa=False, pipeline_key="k", batch_id=1, epoch=1)
    engine = SparkBatchEngine(session_factory=lambda: None,
                              kafka_config={"bootstrap.servers": "k:9092", "sasl.mechanism": "PLAIN",
                                            "sasl.password": SECRET},
                              parse=ParseConfig(ValueFormat.STRING),
                              kafka_options={"kafka.fetch.max.bytes": "1048576"})
    info = ConnectionInfo("c", "mysql", "db", 3306, "eo", SECRET, "d", {"ssl": {"key_password": SECRET}})
    for holder in (writer, engine, info):
        assert SECRET not in repr(holder) and SECRET not in str(holder), type(holder).__name__
    assert "table='t'" in repr(writer) and "ParseConfig" in repr(engine)  # the rest is still shown
