"""Each pytest-xdist worker of ``make test`` talks to its own lane's stack (tests/support/lanes.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.lanes import group_of, lane_env_file, lane_number, read_env_file


def test_this_worker_uses_its_lanes_stack_from_before_airflow_read_its_home():
    from airflow import configuration

    lane = lane_number()
    if lane > 1:
        expected = read_env_file(lane_env_file(lane))
        for name in ("AIRFLOW_HOME", "EO_KAFKA_BOOTSTRAP", "AIRFLOW_CONN_MYSQL_DEFAULT", "EO_STACK_DIR"):
            assert os.environ[name] == expected[name], name
    # Airflow read its home once, at import: it must be this lane's, else two lanes share one metadata database.
    assert Path(configuration.AIRFLOW_HOME) == Path(os.environ["AIRFLOW_HOME"])
    assert os.environ["AIRFLOW_HOME"] in configuration.conf.get("database", "sql_alchemy_conn")


def test_files_needing_fixed_ports_share_one_group_and_others_run_whole():
    assert group_of("tests/cluster/test_pipelines_on_cluster.py") == group_of("tests/cluster/test_x.py")
    assert group_of("tests/scheduler/test_backfills.py") == group_of("tests/ui/test_exactly_once_tab.py")
    assert group_of("tests/integration/test_crash.py") == "tests/integration/test_crash.py"
