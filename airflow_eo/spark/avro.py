"""Avro keys and values decoded in Spark's JVM (``from_avro`` of the spark-avro jar), bare or Confluent-framed.

Confluent framing is magic byte 0, the writer schema's id (4 bytes, big-endian), then the Avro binary. Each record
is decoded with its own writer schema (one ``from_avro`` per known id, chosen by a CASE on the id) and resolved into
the reader schema by Avro's schema resolution (Spark's ``avroSchema`` option): records of several writer versions
in one batch come out in one shape. A record that does not decode is a bad record, not a failed job: ``from_avro``
runs in PERMISSIVE mode, which yields a row of NULLs for it; the reader schema gets an extra field with a default
(:data:`~airflow_eo.core.config.AVRO_DECODED_FIELD`) that is true in every record that did decode. A record claiming
a string, bytes or array longer than Avro's length limits (set by ``spark/session.py``) does not decode either.

Writer schemas the supplied ones lack are asked of a lookup (a schema registry) through :class:`SchemaLookups`: at
most once per distinct id and batch, at most :data:`MAX_LOOKUPS_PER_BATCH` ids a batch, an id it does not give
remembered as unknown for the rest of the batch; its records are bad records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_eo.core.config import AVRO_DECODED_FIELD, Framing
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark.columns import computed_once
from airflow_eo.spark.spark_connect import is_connect

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

HEADER_BYTES = 5  # Confluent framing: magic byte + 4-byte schema id
#: Schema ids a batch may ask the lookup for: a batch of garbage that starts with byte 0 carries random "ids", each
#: of which would otherwise cost a registry request. Far more than the writer versions a topic gains in a batch.
MAX_LOOKUPS_PER_BATCH = 100
NOT_SUPPLIED = "not in writer_schemas nor the schema registry"


class SchemaLookups:
    """One batch's questions to a schema lookup (``id -> Avro schema text``; None or ``LookupError`` for an id it
    does not give, any other exception fails the batch): each distinct id asked once, keys and values alike, an
    unknown one remembered with why; at most ``limit`` ids asked, the ids beyond are unknown without asking."""

    def __init__(self, lookup: Callable[[int], str | None], limit: int = MAX_LOOKUPS_PER_BATCH) -> None:
        self.lookup, self.limit = lookup, limit
        self.found: dict[int, str] = {}
        self.unknown: dict[int, str] = {}  # id -> why

    @property
    def remaining(self) -> int:
        return self.limit - len(self.found) - len(self.unknown)

    def resolve(self, ids: Iterable[int]) -> tuple[dict[int, str], dict[int, str]]:
        """The writer schemas of ``ids`` and, for the others, why there is none."""
        found: dict[int, str] = {}
        unknown: dict[int, str] = {}
        for schema_id in sorted(set(ids)):
            if schema_id not in self.found and schema_id not in self.unknown:
                if self.remaining <= 0:
                    unknown[schema_id] = self.not_asked()
                    continue
                try:
                    schema = self.lookup(schema_id)
                except LookupError as exc:
                    self.unknown[schema_id] = f"not in writer_schemas; {exc}"
                else:
                    if schema is None:
                        self.unknown[schema_id] = NOT_SUPPLIED
                    else:
                        self.found[schema_id] = schema
            if schema_id in self.found:
                found[schema_id] = self.found[schema_id]
            elif schema_id in self.unknown:
                unknown[schema_id] = self.unknown[schema_id]
        return found, unknown

    def not_asked(self) -> str:
        return (f"not in writer_schemas; the schema registry was not asked: the batch has more than {self.limit} "
                "schema ids writer_schemas lacks")


def decode_avro(spark: SparkSession, df: DataFrame, column: str, reader: str, framing: Framing,
                writers: Mapping[int, str], lookup: SchemaLookups | None, tag: str, what: str
                ) -> tuple[DataFrame, list[str], Column]:
    """``df`` with the binary ``column`` decoded into the struct column ``tag`` (the reader schema's fields); the
    field names and the error expression (NULL when good; a NULL ``column`` is the caller's to judge).

    :param reader: the reader schema (an Avro record, JSON text).
    :param writers: writer schemas by Confluent schema id (``framing="confluent"``).
    :param lookup: asked for the writer schemas of ids in the batch that ``writers`` lacks (a schema registry); one
        per batch, shared by its key and value.
    :param what: ``"value"`` or ``"key"``, for error messages.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    schema = json.loads(reader)
    fields = [f["name"] for f in schema["fields"]]
    marked = {**schema, "fields": [*schema["fields"], {"name": AVRO_DECODED_FIELD, "type": "boolean",
                                                       "default": True}]}
    options = {"mode": "PERMISSIVE", "avroSchema": json.dumps(marked)}
    binary = F.col(column)
    decoded_flag = F.col(f"{tag}.{AVRO_DECODED_FIELD}")
    _check_reader(spark, reader, what)
    if framing is Framing.NONE:
        df = computed_once(df, tag, from_avro(binary, reader, options))
        error = F.when(decoded_flag.isNull(), F.lit(f"{what} is not an Avro record of the reader schema (truncated, "
                                                    "written with another schema, or claiming a length beyond "
                                                    "Avro's limit)"))
        return df, fields, error

    length = F.length(binary)
    schema_id = F.conv(F.hex(F.substring(binary, 2, 4)), 16, 10).cast("long")
    framed = (length >= HEADER_BYTES) & (F.hex(F.substring(binary, 1, 1)) == F.lit("00"))
    known = dict(writers)
    unknown: dict[int, str] = {}
    beyond_limit = False
    if lookup is not None:  # the batch's ids not answered yet, one more than the lookup may still be asked
        known.update(lookup.found)
        unknown.update(lookup.unknown)
        answered = [*known, *unknown]
        lacking = framed & ~schema_id.isin(answered) if answered else framed
        budget = max(lookup.remaining, 0)
        in_batch = [int(r[0]) for r in df.where(lacking).select(schema_id).distinct().limit(budget + 1).collect()]
        beyond_limit = len(in_batch) > budget
        found, refused = lookup.resolve(in_batch)
        known.update(found)
        unknown.update(refused)
    incompatible = _incompatible(spark, reader, known)
    payload = binary.substr(F.lit(HEADER_BYTES + 1), length - HEADER_BYTES)
    decoded: Column | None = None
    for schema_id_value, writer in sorted(known.items()):
        if schema_id_value in incompatible:
            continue
        branch = from_avro(payload, writer, options)
        decoded = (F.when(schema_id == schema_id_value, branch) if decoded is None
                   else decoded.when(schema_id == schema_id_value, branch))
    if decoded is None:  # no decodable id: every record is bad, the column still has the reader's type
        decoded = from_avro(F.lit(None).cast("binary"), reader, options)
    df = computed_once(df, tag, F.when(framed, decoded))
    if lookup is not None and beyond_limit:
        where = lookup.not_asked()
    else:
        where = "not in writer_schemas" + (" nor the schema registry" if lookup is not None else "")
    error = F.when(length < HEADER_BYTES, F.concat(
        F.lit(f"{what} is "), length.cast("string"),
        F.lit(" bytes, shorter than the Confluent header (magic byte 0 + 4-byte schema id)"))).when(
        ~framed, F.concat(F.lit(f"{what} starts with byte 0x"), F.hex(F.substring(binary, 1, 1)),
                          F.lit(", not the Confluent magic byte 0x00 (framing='confluent')")))
    for schema_id_value, why in sorted(unknown.items()):
        error = error.when(schema_id == schema_id_value, F.lit(f"{what}: unknown schema id {schema_id_value} ({why})"))
    error = error.when(
        ~schema_id.isin(list(known)) if known else F.lit(True),
        F.concat(F.lit(f"{what}: unknown schema id "), schema_id.cast("string"), F.lit(f" ({where})")))
    for schema_id_value, message in sorted(incompatible.items()):
        error = error.when(schema_id == schema_id_value, F.lit(
            f"{what}: writer schema id {schema_id_value} is incompatible with the reader schema: {message}"))
    error = error.when(decoded_flag.isNull(), F.concat(
        F.lit(f"{what}: not an Avro record of writer schema id "), schema_id.cast("string"),
        F.lit(" (truncated, corrupt, or claiming a length beyond Avro's limit)")))
    return df, fields, error


def _check_reader(spark: SparkSession, reader: str, what: str) -> None:
    if is_connect(spark):
        return
    try:
        getattr(_avro_package(spark), "Schema$Parser")().parse(reader)
    except Exception as exc:  # Py4JJavaError: SchemaParseException
        raise ConfigurationError(f"the {what} reader schema is not a valid Avro schema: {_java_message(exc)}") from exc


def _incompatible(spark: SparkSession, reader: str, writers: Mapping[int, str]) -> dict[int, str]:
    """Writer schemas (by id) that Avro's schema resolution cannot read into ``reader``, each with why (the field).

    Checked once per batch in the driver's JVM with Avro's ``SchemaCompatibility``; under Spark Connect (no JVM
    here) not checked: such records then fail to decode and are bad records all the same, named by their id only.
    """
    if is_connect(spark) or not writers:
        return {}
    avro = _avro_package(spark)

    def parse(text: str) -> object:
        return getattr(avro, "Schema$Parser")().parse(text)

    reader_schema, reader_dict = parse(reader), json.loads(reader)
    out: dict[int, str] = {}
    for schema_id, writer in writers.items():
        try:
            result = avro.SchemaCompatibility.checkReaderWriterCompatibility(reader_schema, parse(writer)).getResult()
        except Exception as exc:
            out[schema_id] = f"not a valid Avro schema: {_java_message(exc)}"
            continue
        if str(result.getCompatibility()) == "INCOMPATIBLE":
            out[schema_id] = "; ".join(_describe(reader_dict, str(i.getType()), str(i.getMessage()),
                                                 str(i.getLocation())) for i in result.getIncompatibilities())
    return out


def _describe(reader: Any, kind: str, message: str, location: str) -> str:
    """An incompatibility named by its field: Avro locates it by a JSON pointer into the reader schema."""
    names, node, parts = [], reader, location.strip("/").split("/")
    for i, part in enumerate(parts):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            if i > 0 and parts[i - 1] == "fields" and isinstance(node, dict):
                names.append(str(node.get("name")))
        else:
            break
    field = ".".join(names) or "the record"
    if kind == "READER_FIELD_MISSING_DEFAULT_VALUE":
        return f"field {field!r} is not in the writer schema and has no default"
    return f"field {field!r}: {message}"


def _avro_package(spark: SparkSession) -> Any:
    """``org.apache.avro`` in the driver's JVM (a classic session)."""
    jvm: Any = spark._jvm
    return jvm.org.apache.avro


def _java_message(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    return str(java.getMessage()) if java is not None else str(exc).splitlines()[0]
