import pytest

from airflow_eo.core.config import UpdateMode
from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.identifiers import quote_table
from airflow_eo.mysql.sql import (
    keeps_prepared_xa,
    parse_server_version,
    supports_row_alias,
    upsert_statement,
)
from airflow_eo.sinks import MySqlUpsertSink, MySqlXaSink


def test_mariadb_upsert_uses_values_function():
    sql = upsert_statement("app_pv", ["app_id", "pv"], ["app_id"], {"pv": "add"}, 2, row_alias=False)
    assert sql == ("INSERT INTO `app_pv` (`app_id`, `pv`) VALUES (%s, %s), (%s, %s) "
                   "ON DUPLICATE KEY UPDATE `pv` = `pv` + VALUES(`pv`)")


def test_mysql8_upsert_uses_row_alias():
    sql = upsert_statement("db.t", ["k", "v"], ["k"], {}, 1, row_alias=True)
    assert sql == ("INSERT INTO `db`.`t` (`k`, `v`) VALUES (%s, %s) AS `eo_new` "
                   "ON DUPLICATE KEY UPDATE `v` = `eo_new`.`v`")


@pytest.mark.parametrize("bad", ["a;drop table x", "a`b", "1abc", "", "a b", "x" * 65])
def test_bad_identifiers_are_refused(bad):
    with pytest.raises(ConfigurationError, match="invalid"):
        quote_table(bad)


def test_upsert_sink_refuses_accumulating_updates_pointing_to_xa():
    with pytest.raises(ConfigurationError, match="MySqlXaSink"):
        MySqlUpsertSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"})
    xa = MySqlXaSink(table="app_pv", key_columns=["app_id"], updates={"pv": "add"})
    assert xa.updates == {"pv": UpdateMode.ADD} and not xa.replay_safe


def test_unknown_update_mode_is_refused():
    with pytest.raises(ConfigurationError, match="replace, add"):
        MySqlXaSink(table="app_pv", key_columns=["app_id"], updates={"pv": "multiply"})


@pytest.mark.parametrize(("version", "flavor", "parsed", "alias", "keeps"), [
    ("10.11.19-MariaDB-0+deb12u1", "mariadb", (10, 11, 19), False, True),
    ("5.5.5-10.4.3-MariaDB", "mariadb", (10, 4, 3), False, False),
    ("8.0.36", "mysql", (8, 0, 36), True, True),
    ("8.0.18", "mysql", (8, 0, 18), False, True),
    ("5.7.6-log", "mysql", (5, 7, 6), False, False),
])
def test_server_versions(version, flavor, parsed, alias, keeps):
    assert parse_server_version(version) == (flavor, parsed)
    assert supports_row_alias(flavor, parsed) is alias
    assert keeps_prepared_xa(flavor, parsed) is keeps
