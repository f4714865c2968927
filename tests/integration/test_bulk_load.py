"""The bulk-load writer against the real MariaDB, on both of its paths (LOAD DATA LOCAL INFILE into a staging table +
INSERT .. SELECT; LOAD DATA .. REPLACE straight into the table where that equals the upsert): it writes exactly what
the multi-row statements write, for hostile text and every staged type, keeps the statements' last-row-wins and
``add`` semantics, leaves an XA branch invisible until commit, and fails loudly on a bad value. The sink reads the
table's shape and takes the replacing path only where replacing a row whole equals the upsert."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import uuid
from typing import Any

import pyarrow as pa
import pymysql
import pytest

from airflow_eo.core.xid import Xid, pipeline_key
from airflow_eo.mysql.bulk_load import staging_types
from airflow_eo.mysql.writer import PartitionWriter
from airflow_eo.mysql.xa import XaFacade

HOSTILE = ["a,b", 'q"x', '"', '""', "", "NULL", "\\N", "l1\nl2", "cr\r\nlf", "tab\there", "back\\slash", "’ünï 😀",
           "'; DROP TABLE x; --", "end\\", ",", "\n"]

COLUMNS = ("id", "s", "n", "f", "f32", "d", "ts", "dt", "b", "u")


def table_ddl(name: str) -> str:
    return (f"CREATE TABLE `{name}` (id BIGINT PRIMARY KEY, s TEXT NULL, n BIGINT NULL, f DOUBLE NULL, f32 DOUBLE NULL,"
            " d DECIMAL(12,3) NULL, ts DATETIME(6) NULL, dt DATE NULL, b BOOLEAN NULL, u BIGINT UNSIGNED NULL) "
            "DEFAULT CHARSET=utf8mb4")


def batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("n", pa.int32()), ("f", pa.float64()),
                        ("f32", pa.float32()), ("d", pa.decimal128(12, 3)), ("ts", pa.timestamp("us", tz="UTC")),
                        ("dt", pa.date32()), ("b", pa.bool_()), ("u", pa.uint64())])
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def hostile_rows(count: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(count):
        null = i % 7 == 3
        rows.append({
            "id": i, "s": None if null else HOSTILE[i % len(HOSTILE)] * (1 + i % 3),
            "n": None if null else (-1) ** i * i * 1000, "f": None if null else i / 3 - 7.25e10,
            "f32": None if null else i / 7, "d": None if null else decimal.Decimal(i) / 8,
            "ts": None if null else datetime.datetime(2026, 11, 23, 1, 2, 3, i, tzinfo=datetime.UTC),
            "dt": None if null else datetime.date(2026, 1, 1) + datetime.timedelta(days=i),
            "b": None if null else i % 2 == 0, "u": None if null else 2**64 - 1 - i,
        })
    return rows


@pytest.fixture
def tables(mysql):
    names = [f"bulk_{uuid.uuid4().hex[:8]}_{k}" for k in ("load", "stmt")]
    with mysql.cursor() as cur:
        for name in names:
            cur.execute(table_ddl(name))
    yield names
    with mysql.cursor() as cur:
        for name in names:
            cur.execute(f"DROP TABLE IF EXISTS `{name}`")


def writer(mysql_kwargs: dict[str, Any], table: str, bulk_load: bool, **changes: Any) -> PartitionWriter:
    base = PartitionWriter(connect_kwargs=mysql_kwargs, table=table, columns=COLUMNS, key_columns=("id",),
                           updates={}, row_alias=False, rows_per_statement=100, xa=False,
                           pipeline_key=pipeline_key(f"bulk-{uuid.uuid4().hex[:6]}"), batch_id=1, epoch=1,
                           bulk_load=bulk_load)
    return dataclasses.replace(base, **changes)


def spy_loads(monkeypatch) -> list[str]:
    """The LOAD DATA statements the writers run from now on (the test's own process: the writers run here)."""
    import airflow_eo.mysql.bulk_load as bulk_load

    statements: list[str] = []
    real = bulk_load._load

    def load(cur: Any, statement: str, *args: Any, **kwargs: Any) -> int:
        statements.append(statement)
        return real(cur, statement, *args, **kwargs)

    monkeypatch.setattr(bulk_load, "_load", load)
    return statements


def contents(mysql, table: str) -> list[tuple]:
    with mysql.cursor() as cur:
        cur.execute(f"SELECT * FROM `{table}` ORDER BY 1")
        return list(cur.fetchall())


#: The bulk load's two paths, as the writer's options. A float32 column goes through the staging table on both (its
#: shortest text would read as another DOUBLE): the replacing path's rows leave it out.
PATHS: dict[str, dict[str, Any]] = {
    "staging": {}, "replace": {"replace_rows": True, "columns": tuple(c for c in COLUMNS if c != "f32")}}


@pytest.mark.parametrize("path", PATHS)
def test_the_bulk_load_writes_exactly_what_the_statements_write(path, mysql, mysql_kwargs, tables, monkeypatch):
    import airflow_eo.mysql.bulk_load as bulk_load

    monkeypatch.setattr(bulk_load, "STAGING_FILE_BYTES", 4096)  # several staging files per partition
    assert staging_types(batch([]).schema, COLUMNS) is not None, "every column of this table is staged"
    rows = hostile_rows(600)
    batches = [batch(rows[i:i + 64]) for i in range(0, len(rows), 64)]
    load, stmt = tables
    loads = spy_loads(monkeypatch)
    assert writer(mysql_kwargs, load, True, **PATHS[path])(batches, 0, 0, 0) == (None, 600)
    into = f"LOAD DATA LOCAL INFILE %s REPLACE INTO TABLE `{load}`" if path == "replace" else \
        "LOAD DATA LOCAL INFILE %s INTO TABLE `_airflow_eo_stage`"
    assert len(loads) > 1 and all(statement.startswith(into) for statement in loads)
    columns = PATHS[path].get("columns", COLUMNS)
    assert writer(mysql_kwargs, stmt, False, columns=columns)(batches, 0, 0, 0) == (None, 600)
    loaded, written = contents(mysql, load), contents(mysql, stmt)
    assert len(loaded) == 600
    assert loaded == written
    by_id = {r[0]: r for r in loaded}
    assert by_id[3][1:] == (None,) * 9, "NULL stays NULL, in every type"
    assert by_id[21][1] == "NULL" and by_id[36][1] == "", "the text 'NULL' and the empty text are not NULL"
    assert by_id[39][1] == "l1\nl2", "a newline inside a value is part of it"


@pytest.mark.parametrize("path", PATHS)
def test_later_rows_of_a_key_win_and_a_rerun_rewrites_the_same_rows(path, mysql, mysql_kwargs, tables, monkeypatch):
    import airflow_eo.mysql.bulk_load as bulk_load

    load, stmt = tables
    # Later rows of a key in the same Arrow batch and in a later one, out of key order.
    rows = hostile_rows(50) + [{**r, "s": f"second {r['id']}"} for r in hostile_rows(50)[::-2]]
    rows += [{**r, "s": f"third {r['id']}"} for r in hostile_rows(50)[::-5]]
    batches = [batch(rows[:70]), batch(rows[70:])]
    monkeypatch.setattr(bulk_load, "STAGING_FILE_BYTES", 2048)  # the rows of a key in different files too
    columns = PATHS[path].get("columns", COLUMNS)
    for table, bulk in ((load, True), (stmt, False)):
        for _ in range(2):
            writer(mysql_kwargs, table, bulk, **{**PATHS[path], "columns": columns})(batches, 0, 0, 0)
    assert contents(mysql, load) == contents(mysql, stmt)
    first = hostile_rows(3)
    assert [r[1] for r in contents(mysql, load)[:5]] == [first[0]["s"], "second 1", first[2]["s"], "second 3",
                                                         "third 4"]
    assert contents(mysql, load)[9][1] == "third 9", "the last of three rows of a key wins"


def test_an_xa_branch_of_bulk_loaded_rows_adds_and_stays_invisible_until_commit(mysql, mysql_kwargs):
    table = f"bulk_{uuid.uuid4().hex[:8]}_counts"
    with mysql.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (app VARCHAR(64) PRIMARY KEY, pv BIGINT NOT NULL)")
        cur.execute(f"INSERT INTO `{table}` VALUES ('a', 10)")
    try:
        counts = pa.RecordBatch.from_pylist([{"app": a, "pv": n} for a, n in (("a", 1), ("b", 2), ("a", 3))])
        xa = PartitionWriter(connect_kwargs=mysql_kwargs, table=table, columns=("app", "pv"), key_columns=("app",),
                             updates={"pv": "add"}, row_alias=False, rows_per_statement=100, xa=True,
                             pipeline_key=pipeline_key(f"bulk-{uuid.uuid4().hex[:6]}"), batch_id=1, epoch=1,
                             bulk_load=True)
        text, written = xa([counts], 0, 0, 0)
        assert written == 3 and text
        assert contents(mysql, table) == [("a", 10)], "prepared, not visible"
        assert XaFacade(mysql).commit(Xid.decode(text))
        assert contents(mysql, table) == [("a", 14), ("b", 2)]
    finally:
        with mysql.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")


@pytest.mark.parametrize("path", PATHS)
def test_a_value_the_staging_table_cannot_read_fails_the_task_and_writes_nothing(path, mysql, mysql_kwargs, tables):
    load, _ = tables
    rows = hostile_rows(20)
    rows[9]["f"] = float("nan")  # Arrow writes "nan": not a number to MariaDB
    keys = set()
    for xa in (False, True):  # the fenced transaction's or the branch's rows: none is left
        failing = writer(mysql_kwargs, load, True, xa=xa, **PATHS[path])
        keys.add(failing.pipeline_key)
        with pytest.raises(pymysql.err.DataError, match="bulk load of 20 row.*nothing of this task was written"):
            failing([batch(rows)], 0, 0, 0)
        assert contents(mysql, load) == []
    assert [x for x in XaFacade(mysql).recover() if x.pipeline_key in keys] == [], "no branch is left prepared"


@pytest.mark.parametrize("path", PATHS)
def test_binary_columns_are_staged_as_hex_byte_for_byte_and_other_types_go_through_the_statements(path, mysql,
                                                                                                   mysql_kwargs):
    table = f"bulk_{uuid.uuid4().hex[:8]}_bin"
    with mysql.cursor() as cur:
        cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, raw LONGBLOB NULL, other VARBINARY(64) NULL)")
    try:
        every_byte = bytes(range(256))
        values = [b"\xff\x00,\"\n", None, b"", b"NULL", b"\\N", every_byte, every_byte * 3000]
        rows = pa.RecordBatch.from_pylist([{"id": i, "raw": v, "other": v and v[:64]} for i, v in enumerate(values)])
        assert staging_types(rows.schema, ("id", "raw", "other")) is not None
        w = dataclasses.replace(writer(mysql_kwargs, table, True, **PATHS[path]), columns=("id", "raw", "other"))
        assert w([rows.slice(0, 3), rows.slice(3)], 0, 0, 0) == (None, len(values))
        assert contents(mysql, table) == [(i, v, v and v[:64]) for i, v in enumerate(values)]
        # Replayed: the same rows overwrite (UNHEX in the update too), not the hexadecimal text.
        assert w([rows], 0, 0, 0) == (None, len(values))
        assert contents(mysql, table) == [(i, v, v and v[:64]) for i, v in enumerate(values)]

        nested = pa.RecordBatch.from_pylist([{"id": 1, "raw": [1, 2]}])
        assert staging_types(nested.schema, ("id", "raw")) is None  # a list: the statements' business
    finally:
        with mysql.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")


def test_a_float32_column_goes_through_the_staging_table_even_where_rows_are_replaced(mysql, mysql_kwargs, tables,
                                                                                      monkeypatch):
    load, _ = tables
    loads = spy_loads(monkeypatch)
    rows = hostile_rows(40)
    assert writer(mysql_kwargs, load, True, replace_rows=True)([batch(rows)], 0, 0, 0) == (None, 40)
    assert loads and all("`_airflow_eo_stage`" in statement for statement in loads)
    assert contents(mysql, load)[1][4] == pytest.approx(float(pa.scalar(1 / 7, pa.float32()).as_py()), abs=0), \
        "the float32 1/7 as it is, not its shortest text read as a DOUBLE"


#: A table's shape: (more columns or keys, after its DDL, statements after it ({t}: its name), replaced).
SHAPES: dict[str, tuple[str, str, str, bool]] = {
    "plain": ("", "", "", True),
    "a column the output leaves out": (", extra INT NULL DEFAULT 7", "", "", False),
    "a generated column": (", g BIGINT AS (n * 2) VIRTUAL", "", "", True),
    "a second unique key": (", UNIQUE KEY (n)", "", "", False),
    "a trigger": ("", "", "CREATE TRIGGER `{t}_tr` BEFORE DELETE ON `{t}` FOR EACH ROW SET @eo_test = 1", False),
    "a foreign key referring to it": ("", "", "CREATE TABLE `{t}_child` (id BIGINT PRIMARY KEY, parent BIGINT, "
                                      "FOREIGN KEY (parent) REFERENCES `{t}` (id) ON DELETE CASCADE)", False),
    "system versioning": ("", " WITH SYSTEM VERSIONING", "", False),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_sink_reads_the_tables_shape_and_replaces_rows_only_where_that_is_the_upsert(shape, mysql, mysql_kwargs):
    from airflow_eo.mysql.sink import MySqlUpsertAdapter, MySqlXaAdapter

    table = f"bulk_{uuid.uuid4().hex[:8]}_shape"
    more, suffix, after, expected = SHAPES[shape]
    try:
        with mysql.cursor() as cur:
            cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, s TEXT NULL, n BIGINT NULL{more}){suffix}")
            if after:
                cur.execute(after.format(t=table))
        options: dict[str, Any] = dict(name="sink", table=table, key_columns=("id",), updates={},
                                       rows_per_statement=100, dead_letter_table="eo_dead_letter", bulk_load=True)
        for sink in (MySqlUpsertAdapter(mysql_kwargs, **options), MySqlXaAdapter(mysql_kwargs, **options)):
            sink.check()
            assert sink.replaces_rows(("id", "s", "n")) is expected
            assert not sink.replaces_rows(("id", "s")), "a column left out keeps its value in an upsert"
        added = MySqlXaAdapter(mysql_kwargs, **{**options, "updates": {"n": "add"}})
        added.check()
        assert not added.replaces_rows(("id", "s", "n"))
        no_bulk = MySqlUpsertAdapter(mysql_kwargs, **{**options, "bulk_load": False})
        no_bulk.check()
        assert not no_bulk.replaces_rows(("id", "s", "n"))
    finally:
        with mysql.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}_child`")
            if suffix:
                cur.execute(f"ALTER TABLE `{table}` DROP SYSTEM VERSIONING")
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")


#: Who asks whether a foreign key refers to the sink's table: (the user's grants (None: the stack's user; TRIGGER: a
#: user who may not see the table's triggers takes them to exist, and no row is replaced either way), where the sink
#: reads the foreign keys). The stack's user reads MariaDB's InnoDB dictionary (PROCESS); a user who sees every table
#: but may not read the dictionary, information_schema; one who holds privileges on the sink's database only cannot
#: see a referring table elsewhere, even when it may read the mysql database (where information_schema shows it
#: every account's privileges).
ASKERS: dict[str, tuple[tuple[str, ...] | None, str | None]] = {
    "the stack's user": (None, "INNODB_SYS_FOREIGN"),
    "a user without PROCESS": (("SELECT, CREATE, DROP, TRIGGER ON *.*",), "REFERENTIAL_CONSTRAINTS"),
    "a user of the sink's database only": (("SELECT, CREATE, DROP, TRIGGER ON `{database}`.*",
                                            "SELECT ON `mysql`.*"), None),
}


@pytest.mark.parametrize("asker", ASKERS)
def test_a_foreign_key_from_another_database_keeps_rows_from_being_replaced_whoever_asks(asker, mysql, mysql_kwargs):
    """A table in another database whose foreign key refers to the sink's table (ON DELETE CASCADE: a replaced row
    would delete the rows referring to it) keeps the sink on the staging table, whoever asks; without it the rows
    are replaced, except for a user who cannot see every table (the referring table may be one it holds no
    privilege on, so it is taken to exist). MariaDB only, as the stack's server."""
    from airflow_eo.mysql.sink import MySqlUpsertAdapter

    tag = uuid.uuid4().hex[:8]
    table, other, user = f"bulk_{tag}_referred", f"eo_refs_{tag}", f"eo_fk_{tag}"
    database = mysql_kwargs["database"]
    grants, read_from = ASKERS[asker]
    kwargs = mysql_kwargs
    try:
        with mysql.cursor() as cur:
            cur.execute(f"CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, s TEXT NULL, n BIGINT NULL)")
            cur.execute(f"CREATE DATABASE `{other}`")
            if grants is not None:
                cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", (tag,))
                for grant in grants:
                    cur.execute(f"GRANT {grant.format(database=database)} TO '{user}'@'127.0.0.1'")
                kwargs = {**mysql_kwargs, "user": user, "password": tag}

        def replaced() -> bool:
            sink = MySqlUpsertAdapter(kwargs, name="sink", table=table, key_columns=("id",), updates={},
                                      rows_per_statement=100, dead_letter_table="eo_dead_letter", bulk_load=True)
            try:
                sink.check()
                assert sink.foreign_keys_read_from == read_from
                return sink.replaces_rows(("id", "s", "n"))
            finally:
                sink.close()

        assert replaced() is (read_from is not None)
        with mysql.cursor() as cur:
            cur.execute(f"CREATE TABLE `{other}`.`child` (id BIGINT PRIMARY KEY, parent BIGINT, FOREIGN KEY (parent) "
                        f"REFERENCES `{database}`.`{table}` (id) ON DELETE CASCADE)")
        assert not replaced(), "a referring table in another database"
    finally:
        with mysql.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
            cur.execute(f"DROP DATABASE IF EXISTS `{other}`")
            cur.execute(f"DROP TABLE IF EXISTS `{table}`")


def test_the_dead_letter_table_is_loaded_straight_in_and_stamped_by_the_server(mysql, mysql_kwargs, monkeypatch):
    """A dead-letter table as the sink makes it takes the replacing load, its ``created_at`` set by the server at
    the load (the column's default for a new row); one with a column of the user's (here on a table of an older
    release, which gets ``kafka_headers`` first) keeps the staging table: a replace would reset that column."""
    from airflow_eo.core.batch import DEAD_LETTER_FIELDS, BatchContext
    from airflow_eo.mysql.sink import MySqlXaAdapter
    from tests.support.bad_records import V1_DEAD_LETTER_DDL

    events, dead, old = (f"bulk_{uuid.uuid4().hex[:8]}_{k}" for k in ("ev", "dl", "old"))
    with mysql.cursor() as cur:
        cur.execute(f"CREATE TABLE `{events}` (id BIGINT PRIMARY KEY)")
        cur.execute(V1_DEAD_LETTER_DDL.format(name=old))
        cur.execute(f"ALTER TABLE `{old}` ADD COLUMN triaged_by VARCHAR(64) NULL")
    loads = spy_loads(monkeypatch)
    try:
        batch = BatchContext("dl-pipeline", 7, "run", 1, ())
        letters = pa.RecordBatch.from_arrays(
            [pa.array(["dl-pipeline"] * 3), pa.array(["t"] * 3), pa.array([0, 1, 1], pa.int32()),
             pa.array([5, 6, 7], pa.int64()), pa.array([7] * 3, pa.int64()), pa.array([b"k\x00", None, b""]),
             pa.array([b"{bad", b"\xff", None]), pa.array(["malformed JSON", "not UTF-8", "value is null"]),
             pa.array(["[]"] * 3)], names=list(DEAD_LETTER_FIELDS))
        for table, replaced in ((dead, True), (old, False)):
            sink = MySqlXaAdapter(mysql_kwargs, name="sink", table=events, key_columns=("id",), updates={},
                                  rows_per_statement=100, dead_letter_table=table, bulk_load=True)
            sink.check()
            loads.clear()
            xid, written = sink.dead_letter_writer(batch)([letters], -2, 0, 0)
            assert written == 3 and XaFacade(mysql).commit(Xid.decode(xid))
            into = f"LOAD DATA LOCAL INFILE %s REPLACE INTO TABLE `{table}`" if replaced else \
                "LOAD DATA LOCAL INFILE %s INTO TABLE `_airflow_eo_stage`"
            assert loads and all(statement.startswith(into) for statement in loads), loads
            with mysql.cursor() as cur:
                cur.execute(f"SELECT kafka_offset, record_key, raw_value, error, TIMESTAMPDIFF(SECOND, created_at, "
                            f"CURRENT_TIMESTAMP(3)) FROM `{table}` ORDER BY kafka_offset")
                found = cur.fetchall()
            assert [r[:4] for r in found] == [(5, b"k\x00", b"{bad", "malformed JSON"), (6, None, b"\xff", "not UTF-8"),
                                              (7, b"", None, "value is null")]
            assert all(0 <= r[4] < 60 for r in found), "created_at is the time of the load"
    finally:
        with mysql.cursor() as cur:
            for table in (events, dead, old):
                cur.execute(f"DROP TABLE IF EXISTS `{table}`")
