"""What the PostgreSQL sink specs refuse at DAG parse time, and the SQL their writers send (no stack needed)."""

import pytest

from airflow_eo.core.config import SinkRecord, UpdateMode
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.xid import Xid
from airflow_eo.operators import KafkaMicroBatchOperator
from airflow_eo.postgres.prepared import gid, parse_gid
from airflow_eo.postgres.sql import (
    quote_identifier,
    quote_table,
    split_table,
    staging_ddl,
    upsert_from_staging_statement,
)
from airflow_eo.sinks import PostgresTwoPhaseSink, PostgresUpsertSink, sink_kind, spec_from_record


def op(**kwargs):
    defaults = {"task_id": "mb", "topics": ["t"], "value_format": "string",
                "sink": PostgresUpsertSink(table="t", key_columns=["id"])}
    return KafkaMicroBatchOperator(**{**defaults, **kwargs})


def test_the_upsert_sink_refuses_accumulating_updates_pointing_to_the_two_phase_sink():
    with pytest.raises(ConfigurationError, match="counts a record twice.*use PostgresTwoPhaseSink"):
        PostgresUpsertSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"})
    two_phase = PostgresTwoPhaseSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"})
    assert two_phase.updates == {"pv": UpdateMode.ADD} and two_phase.accumulating and not two_phase.replay_safe
    assert sink_kind("PostgresTwoPhaseSink").capabilities.in_doubt_branches
    assert sink_kind("PostgresUpsertSink").capabilities.connection_type == "postgres"


def test_interval_mode_takes_the_upsert_sink_and_refuses_the_two_phase_sink():
    op(mode="interval")
    with pytest.raises(ConfigurationError, match="replay-safe sink"):
        op(mode="interval", sink=PostgresTwoPhaseSink(table="t", key_columns=["id"], updates={"n": "add"}))


@pytest.mark.parametrize("name", ["", "x" * 64, "é" * 32, "a\x00b", "\ud800"])
def test_names_postgresql_cannot_keep_are_refused_at_parse_time(name):
    """Empty, over 63 bytes of UTF-8 (PostgreSQL would silently cut it), NUL, no UTF-8 at all: as a table, a
    schema, the dead-letter table, a key column and an updated column."""
    quoted = '"' + name.replace('"', '""') + '"'
    for options in [{"table": quoted}, {"table": f"{quoted}.t"}, {"dead_letter_table": quoted},
                    {"key_columns": [name]}, {"updates": {name: "replace"}}]:
        with pytest.raises(ConfigurationError,
                           match=r"invalid PostgreSQL (table name|key column|column name) .*1 to 63 bytes of UTF-8"):
            PostgresUpsertSink(**{"table": "t", "key_columns": ["id"], **options})


@pytest.mark.parametrize("table", ['a"b', '"a', '"a"b', "s.t.u", '"s"."t".u', "s.", ".t", 'a""b'])
def test_table_names_that_do_not_parse_are_refused(table):
    with pytest.raises(ConfigurationError, match="invalid"):
        PostgresUpsertSink(table=table, key_columns=["id"])


@pytest.mark.parametrize(("table", "parts", "quoted"), [
    ("Sales.Order", ("Sales", "Order"), '"Sales"."Order"'),
    ('"my.schema"."My ""T"" table"', ("my.schema", 'My "T" table'), '"my.schema"."My ""T"" table"'),
    ('select."user"', ("select", "user"), '"select"."user"'),
    ("a;drop table x", (None, "a;drop table x"), '"a;drop table x"'),
    ("Grüße Ω.1abc", ("Grüße Ω", "1abc"), '"Grüße Ω"."1abc"'),
    ('"' + "é" * 31 + 'x"', (None, "é" * 31 + "x"), '"' + "é" * 31 + 'x"'),  # 63 bytes
])
def test_any_name_postgresql_keeps_is_taken_and_quoted_exactly(table, parts, quoted):
    assert split_table(table) == parts and quote_table(table) == quoted
    spec = PostgresTwoPhaseSink(table=table, key_columns=['k "1".x', "select"], updates={"Ω n": "add"},
                                dead_letter_table=table)
    assert spec.key_columns == ('k "1".x', "select")
    assert quote_identifier('k "1".x') == '"k ""1"".x"'


def test_bad_options_are_refused():
    with pytest.raises(ConfigurationError, match="key_columns must be a non-empty list"):
        PostgresUpsertSink(table="t", key_columns="id")
    with pytest.raises(ConfigurationError, match="replace, add"):
        PostgresTwoPhaseSink(table="t", key_columns=["id"], updates={"n": "multiply"})


@pytest.mark.parametrize("spec", [PostgresUpsertSink(table="s.Events", key_columns=["id"], dead_letter_table="bad"),
                                  PostgresTwoPhaseSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"})])
def test_a_spec_is_recorded_and_rebuilt_from_its_record(spec):
    stored = SinkRecord.from_json(spec.record().to_json())
    assert stored.kind == type(spec).__name__ and stored.accumulating is spec.accumulating
    assert spec_from_record(stored) == spec


def test_the_sql_quotes_with_double_quotes_and_reduces_the_staged_rows_to_one_per_key():
    assert quote_table("Sales.Order") == '"Sales"."Order"'
    assert upsert_from_staging_statement("s.t", '"stage"', ["k", "v"], ["k"], {}) == (
        'INSERT INTO "s"."t" AS "_eo_t" ("k", "v") SELECT DISTINCT ON ("k") "k", "v" FROM "stage" '
        'ORDER BY "k", "_eo_seq" DESC ON CONFLICT ("k") DO UPDATE SET "v" = EXCLUDED."v"')
    assert upsert_from_staging_statement("t", '"stage"', ["k", "n", "v"], ["k"], {"n": "add"}) == (
        'INSERT INTO "t" AS "_eo_t" ("k", "n", "v") SELECT "k", SUM("n"), (ARRAY_AGG("v" ORDER BY "_eo_seq" DESC))[1] '
        'FROM "stage" GROUP BY "k" ON CONFLICT ("k") DO UPDATE SET "n" = "_eo_t"."n" + EXCLUDED."n", '
        '"v" = EXCLUDED."v"')
    assert upsert_from_staging_statement("t", '"stage"', ["k"], ["k"], {}).endswith('ON CONFLICT ("k") DO NOTHING')
    assert staging_ddl("s.t", "_eo_stage_1", ["k"], temporary=False)[0] == (
        'CREATE TABLE "s"."_eo_stage_1" AS SELECT "k" FROM "s"."t" WITH NO DATA')  # logged: see staging_ddl


def test_a_gid_is_the_xid_text_and_only_ours_are_read_back():
    xid = Xid("0123456789ab", 7, 3, -1, 2, 5)
    assert gid(xid) == "eo:0123456789ab:7/3:-1:2:5" and parse_gid(gid(xid)) == xid
    assert parse_gid("eo:0123456789ab:7/3:1:2") is None and parse_gid("other") is None
    assert parse_gid("eo:0123456789ab:7/3:1:2:5'; DROP TABLE x; --") is None


def test_a_record_that_lacks_a_required_field_of_this_version_says_so():
    stored = SinkRecord.from_json(PostgresUpsertSink(table="t", key_columns=["id"]).record().to_json())
    older = SinkRecord.from_json(stored.to_json().replace('"key_columns"', '"key_columns_of_old"'))
    with pytest.raises(ConfigurationError, match=r"record of this PostgresUpsertSink .* does not make a "
                                                 r"PostgresUpsertSink of this version: .*key_columns"):
        spec_from_record(older)
