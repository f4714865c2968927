"""When replacing a row whole (MySQL's LOAD DATA .. REPLACE) leaves what the upsert leaves: the sink's decision."""

from __future__ import annotations

import pytest

from airflow_eo.mysql.sql import innodb_dictionary_name
from airflow_eo.mysql.table_shape import TableShape, why_replace_is_not_upsert

EVENTS = TableShape(columns=("event_id", "app_id", "user_id", "ts"), unique_keys=(frozenset({"event_id"}),))
ALL = ("event_id", "app_id", "user_id", "ts")


def test_every_column_written_overwritten_under_the_only_unique_key_is_a_replace():
    assert why_replace_is_not_upsert(EVENTS, ALL, ("event_id",), {}) is None
    assert why_replace_is_not_upsert(EVENTS, ("TS", "Event_Id", "app_id", "user_id"), ("EVENT_ID",),
                                     {"app_id": "replace"}) is None, "MySQL names compare without case"


@pytest.mark.parametrize(("shape", "columns", "updates", "reason"), [
    (EVENTS, ALL, {"app_id": "add"}, "its updates add to column(s) app_id"),
    (EVENTS, ALL[:3], {}, "leaves column(s) ts out, which an upsert keeps"),
    (EVENTS, (*ALL, "__eo_delete"), {}, "column(s) the table does not store: __eo_delete"),
    (TableShape(EVENTS.columns, (frozenset({"event_id"}), frozenset({"user_id", "ts"}))), ALL, {},
     "another unique key"),
    (TableShape(EVENTS.columns, EVENTS.unique_keys, has_triggers=True), ALL, {}, "triggers"),
    (TableShape(EVENTS.columns, EVENTS.unique_keys, referenced=True), ALL, {}, "a foreign key refers to the table"),
    (TableShape(EVENTS.columns, EVENTS.unique_keys, foreign_keys_hidden=True), ALL, {},
     "a foreign key may refer to the table from a table the check's user cannot see"),
    (TableShape(EVENTS.columns, EVENTS.unique_keys, plain=False), ALL, {}, "not a plain base table"),
])
def test_anything_a_replace_would_do_otherwise_keeps_the_staging_table(shape, columns, updates, reason):
    why = why_replace_is_not_upsert(shape, columns, ("event_id",), updates)
    assert why is not None and reason in why


def test_a_key_that_is_not_the_tables_unique_key_is_no_replace():
    assert "another unique key" in why_replace_is_not_upsert(EVENTS, ALL, ("app_id",), {})


@pytest.mark.parametrize(("database", "table", "name"), [
    ("airflow_eo", "Page_Views", "airflow_eo/Page_Views"),
    ("my-shop", "page_views", None),
    ("caf\u00e9", "page_views", None),
    ("airflow_eo", "aux", None),
    ("Com7", "page_views", None),
    ("airflow_eo", "console", "airflow_eo/console"),
])
def test_innodb_names_a_table_database_slash_table_and_other_names_are_asked_elsewhere(database, table, name):
    """The name a foreign key's referred table has in MariaDB's InnoDB dictionary; None where InnoDB encodes the name
    (a character other than ASCII letters, digits and _, or a Windows device's name): the sink then reads
    information_schema."""
    assert innodb_dictionary_name(database, table) == name
