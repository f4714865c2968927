"""A Protobuf record whose values Spark cannot hold is a bad record, never a crash of the Spark task that decodes
its batch: a Timestamp beyond year 9999 (Python's datetime overflows), a proto2 ``string`` that is not UTF-8 (upb
hands the raw bytes over; Arrow refuses them for a string column). Runs the executors' decoder on an Arrow batch,
as ``mapInArrow`` calls it (no Spark needed: it needs pyspark's types, pyarrow and protobuf)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2

from airflow_eo.spark.protobuf import decode_batches, message_class, spark_schema

F = descriptor_pb2.FieldDescriptorProto


def descriptor_blob() -> bytes:
    """p2.proto (proto2): Event {optional string name = 1; optional google.protobuf.Timestamp at = 2;}."""
    out = descriptor_pb2.FileDescriptorSet()
    timestamp_pb2.DESCRIPTOR.CopyToProto(out.file.add())
    proto = out.file.add(name="p2.proto", package="p2", syntax="proto2", dependency=["google/protobuf/timestamp.proto"])
    event = proto.message_type.add(name="Event")
    event.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="at", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".google.protobuf.Timestamp")
    return out.SerializeToString()


@pytest.mark.parametrize("what", ["value", "key"])  # keys (key_format='protobuf') go through the same decoder
def test_values_spark_cannot_hold_make_bad_records_and_the_rest_of_the_batch_decodes(what):
    blob = descriptor_blob()
    event = message_class(blob, "p2.Event")
    good = event(name="fine")
    good.at.FromSeconds(1_700_000_000)
    far = event(name="far future")
    far.at.seconds = 400_000_000_000  # year ~14,600: a valid protobuf Timestamp field, not a Python datetime
    not_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (string), 2 bytes that are not UTF-8: proto2 parses it
    values = [good.SerializeToString(), far.SerializeToString(), not_utf8, None, good.SerializeToString()]
    batch = pa.RecordBatch.from_arrays([pa.array(values, type=pa.binary())], names=["value"])
    struct = spark_schema(event.DESCRIPTOR)

    [out] = list(decode_batches(blob, "p2.Event", False, "value", what, struct.json(), "_pb", iter([batch])))
    decoded, errors = out.column("_pb").to_pylist(), out.column("_pb_error").to_pylist()
    assert [d and d["name"] for d in decoded] == ["fine", None, None, None, "fine"]
    assert errors[0] is None and errors[3] is None and errors[4] is None
    assert errors[1].startswith(f"{what}: ") and "OverflowError" in errors[1] and "value Spark cannot hold" in errors[1]
    assert errors[2].startswith(f"{what}: ") and "not valid UTF-8" in errors[2] and "'name'" in errors[2]


def test_a_row_arrow_refuses_is_isolated_into_a_bad_record():
    """The net under the decoder: whatever value Arrow refuses for the Spark type is found row by row."""
    from airflow_eo.spark.protobuf import _arrow_rows

    arrow = pa.struct([pa.field("name", pa.string()), pa.field("n", pa.int32())])
    rows = [{"name": "a", "n": 1}, {"name": "b", "n": 2**40}, None, {"name": "c", "n": 3}]
    errors: list[str | None] = [None, None, None, None]
    out = _arrow_rows(rows, errors, arrow, "key").to_pylist()
    assert out == [{"name": "a", "n": 1}, None, None, {"name": "c", "n": 3}]
    assert errors[0] is None and errors[2] is None and errors[3] is None
    assert errors[1] is not None and errors[1].startswith("key: a value Spark cannot hold")
