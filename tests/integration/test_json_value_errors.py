"""The error a JSON value gets, whether Spark parses it or it cannot hold a JSON object and is not parsed
(:func:`~airflow_eo.spark.json_text.may_open_json_document`): the same as when every value was parsed twice."""

from __future__ import annotations

import pytest

from airflow_eo.core.config import KeyFormat, ParseConfig
from airflow_eo.spark import parsing
from airflow_eo.spark.session import get_session

SCHEMA = "event_id STRING NOT NULL, n INT"
GOOD = b'{"event_id": "e", "n": 1}'
VALUES: list[tuple[bytes | None, str | None]] = [
    (GOOD, None),
    (b' \t\r\n' + GOOD, None),
    (b'[' + GOOD + b']', "malformed JSON"),  # parsed: Spark reads no struct from an array
    (b"\xef\xbb\xbf" + GOOD, "malformed JSON"),  # a byte-order mark: parsed, as before
    (b'{"event_id": "e", "n": "x"}', "field 'n' is not a valid int"),
    (b'{"n": 1}', "required field 'event_id' is missing or null"),
    (b'{"event_id": "e", "n": 1', "malformed JSON"),
    (b"GET /index.html 200", "malformed JSON"),
    (b"", "malformed JSON"),
    (b"   ", "malformed JSON"),
    (b"null", "malformed JSON"),
    (b"123", "malformed JSON"),
    (b'"text"', "malformed JSON"),
    (b"\xc2\xa0" + GOOD, "malformed JSON"),  # a no-break space is not JSON's whitespace
    (b"/* c */" + GOOD, "malformed JSON"),
    (b"\x00\x00\x00\x00\x01binary", "malformed JSON"),
    (b"\xff\xfe{}", "value is not valid UTF-8"),
    (None, "value is null"),
]


def records(spark, values: list[bytes | None]):
    """Kafka records (as the engine reads them) of these values, at offsets 0, 1, .."""
    return spark.createDataFrame(
        [("t", 0, i, None, None, value, None) for i, value in enumerate(values)],
        "kafka_topic STRING, kafka_partition INT, kafka_offset LONG, kafka_timestamp TIMESTAMP, kafka_key BINARY, "
        "kafka_value BINARY, kafka_headers ARRAY<STRUCT<key: STRING, value: BINARY>>")


def errors(spark, values: list[bytes | None]) -> list[str | None]:
    parsed, _ = parsing.parse_records(spark, records(spark, values), ParseConfig(schema=SCHEMA))
    return [row[0] for row in parsed.orderBy("kafka_offset").select("_eo_error").collect()]


@pytest.fixture(scope="module")
def spark():
    return get_session()


def test_each_value_gets_its_error(spark):
    assert errors(spark, [value for value, _ in VALUES]) == [error for _, error in VALUES]


def test_values_left_unparsed_get_the_error_a_parse_gave_them(spark, monkeypatch):
    from pyspark.sql import functions as F

    values = [value for value, _ in VALUES]
    found = errors(spark, values)
    monkeypatch.setattr(parsing, "may_open_json_document", lambda text: F.lit(True))  # every value parsed twice
    assert errors(spark, values) == found


def test_a_filter_on_the_error_leaves_each_value_parsed_by_two_from_jsons(spark):
    """The typed parse and the parse as text, each computed once per record (one ``computed_once`` barrier above
    both): a filter on the error pushed beneath them would put a from_json in every reference of the error (~20 per
    record), and the typed parse inlined into the parse as text would be two more."""
    from pyspark.sql import functions as F

    def from_jsons(df) -> int:
        plan = df._jdf.queryExecution().executedPlan().toString()
        return plan.count("from_json(")

    bad_value = b'{"event_id": "e", "n": "x"}'
    parsed, payload = parsing.parse_records(spark, records(spark, [GOOD, bad_value]), ParseConfig(schema=SCHEMA))
    good = parsed.where(F.col("_eo_error").isNull()).select(*payload)
    assert from_jsons(good) == 2
    assert [tuple(row) for row in good.collect()] == [("e", 1)]
    dead_letters = parsed.where(F.col("_eo_error").isNotNull()).select("kafka_value", "_eo_error")  # as routed
    assert from_jsons(dead_letters) == 2
    assert [row[1] for row in dead_letters.collect()] == ["field 'n' is not a valid int"]
    # A JSON key is parsed the same way: two more.
    keyed = records(spark, [GOOD]).withColumn("kafka_key", F.lit(b'{"k": "a"}'))
    parsed, payload = parsing.parse_records(spark, keyed, ParseConfig(schema=SCHEMA, key_format=KeyFormat.JSON,
                                                                      key_schema="k STRING"))
    assert from_jsons(parsed.where(F.col("_eo_error").isNull()).select(*payload, "key")) == 4
