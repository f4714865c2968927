"""The local MariaDB keeps prepared XA branches across disconnects, as the XA sink needs."""

from __future__ import annotations

import threading
import uuid

import pymysql
import pytest

from airflow_eo.core.errors import UnavailableError
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


def test_a_branch_still_held_by_the_session_that_prepared_it_is_waited_for_not_taken_as_ended(mysql_kwargs):
    """MariaDB answers XAER_NOTA ("unknown xid") for a prepared branch whose session has not let go of it yet, as for a
    moment after an executor closed its connection. A commit then must wait for the branch, not report it ended: the
    second CI run of stop 27 saw a commit right after the writer's close return False and leave the branch prepared
    (its locks then held a DROP TABLE until the lock wait timeout)."""
    table = f"xa_{uuid.uuid4().hex[:8]}"
    other = pymysql.connect(**mysql_kwargs, autocommit=True)
    with other.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
    key = uuid.uuid4().hex[:12]
    try:
        for row, release in ((1, True), (2, False)):
            xid = Xid(key, row, 1, 0)
            holder = pymysql.connect(**mysql_kwargs, autocommit=True)
            held = XaFacade(holder)
            held.start(xid)
            with holder.cursor() as cur:
                cur.execute(f"INSERT INTO {table} VALUES (%s)", (row,))
            held.prepare(xid)
            if release:  # the session closes while the other one is already committing
                closer = threading.Timer(0.5, holder.close)
                closer.start()
                assert XaFacade(other).commit(xid)
                closer.join()
            else:  # a session that never lets go: a bounded wait and an error that says what holds the branch
                with pytest.raises(UnavailableError, match="another session of the sink's server still holds it"):
                    XaFacade(other, attached_timeout_s=0.5).commit(xid)
                assert xid in XaFacade(other).recover()  # still prepared: nothing was changed
                assert held.rollback(xid)
                holder.close()
        with other.cursor() as cur:
            cur.execute(f"SELECT id FROM {table}")
            assert [r[0] for r in cur.fetchall()] == [1]
        assert not [x for x in XaFacade(other).recover() if x.pipeline_key == key]
    finally:
        with other.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        other.close()
