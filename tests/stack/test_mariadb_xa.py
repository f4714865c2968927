"""The local MariaDB keeps prepared XA branches across disconnects, as the XA sink needs."""

from __future__ import annotations

import uuid

import pymysql

from airflow_eo.core.xid import Xid
from airflow_eo.mysql.xa import XaFacade


def test_prepared_branch_survives_disconnect_and_is_resolved_from_another_connection(mysql_kwargs):
    table = f"xa_{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(**mysql_kwargs, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
    key = uuid.uuid4().hex[:12]
    to_commit, to_rollback = Xid(key, 1, 1, 0), Xid(key, 1, 1, 1)
    for xid, row in ((to_commit, 1), (to_rollback, 2)):
        conn = pymysql.connect(**mysql_kwargs, autocommit=True)
        with conn.cursor() as cur:
            cur.execute(f"XA START {xid.sql()}")
            cur.execute(f"INSERT INTO {table} VALUES (%s)", (row,))
            cur.execute(f"XA END {xid.sql()}")
            cur.execute(f"XA PREPARE {xid.sql()}")
        conn.close()  # the branch must outlive its connection

    other = pymysql.connect(**mysql_kwargs, autocommit=True)
    recovered = {x for x in XaFacade(other).recover() if x.pipeline_key == key}
    assert recovered == {to_commit, to_rollback}
    with other.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {table}")
        assert cur.fetchone()[0] == 0  # nothing visible while prepared
    assert XaFacade(other).commit(to_commit)
    assert XaFacade(other).rollback(to_rollback)
    assert not XaFacade(other).commit(to_commit)  # unknown xid now: tolerated, reported
    with other.cursor() as cur:
        cur.execute(f"SELECT id FROM {table}")
        assert [r[0] for r in cur.fetchall()] == [1]
        cur.execute(f"DROP TABLE {table}")
    assert not [x for x in XaFacade(other).recover() if x.pipeline_key == key]
    other.close()
    admin.close()
