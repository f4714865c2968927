"""``scripts/breadth.py --short``: a batch over 200 partitions next to one over three, pipelines alone and
several at a time on one store; every batch's output checked by the script, the ratios printed, and nothing left
behind (topics, tables). Nothing here is about speed (the machine is shared)."""

from __future__ import annotations

import time

import pymysql
from confluent_kafka.admin import AdminClient

from tests.support.short_scripts import run_short


def test_breadth_short_measures_a_wide_topic_and_pipelines_sharing_a_store(tmp_path, bootstrap,
                                                                                      mysql_kwargs):
    out = tmp_path / "breadth.json"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    before = set(admin.list_topics(timeout=10).topics)  # another run's, killed before it cleaned up, are not this one's
    results, stdout = run_short("breadth.py", out, timeout=900)
    narrow, broad = results["wide"]
    assert (narrow["partitions"], broad["partitions"]) == (3, 200)
    for batch in (narrow, broad):
        assert batch["records"] == 20_000
        assert 0 < batch["protocol_s"] < batch["seconds"] and 0 < batch["protocol_share"] < 1
        assert all(batch["phases"][phase] >= 0 for phase in ("plan", "commit", "finalize", "group_mirror"))
        assert batch["driver_peak_rss_mb"]["python"] > 0 and batch["driver_peak_rss_mb"]["jvm"] > 0
    assert set(broad["memory_ratio_to_3_partitions"]) == {"python", "jvm"}
    alone, shared = results["many"]
    assert (alone["pipelines"], alone["at_a_time"], shared["pipelines"], shared["at_a_time"]) == (2, 1, 4, 2)
    for setting in (alone, shared):
        assert len({batch["pipeline"] for batch in setting["batches"]}) == setting["pipelines"]
        assert 0 < setting["median_protocol_s"] <= setting["max_protocol_s"]
        assert all(value >= 0 for value in setting["lock"].values())
        # the server's statements per batch (the probes' own left out), the protocol's calls timed, round trips probed
        assert setting["statements_per_batch"] > 0
        assert all(batch["calls"]["store.commit_batch"] > 0 and batch["calls"]["sink.check"] > 0
                   and "sink.write" not in batch["calls"] for batch in setting["batches"])
        probed = setting["round_trips"]
        assert probed["probes"] > 0 and all(probed[k] > 0 for k in ("store_median_s", "commit_median_s",
                                                                     "kafka_median_s"))
    assert "target <= 5%" in stdout and "(target <= 1.5)" in stdout and "a committed write x" in stdout
    left, deadline = ["?"], time.monotonic() + 60
    while left and time.monotonic() < deadline:  # a deleted topic leaves the metadata a moment later
        left = [topic for topic in set(admin.list_topics(timeout=10).topics) - before if topic.startswith("breadth_")]
        time.sleep(0.5 if left else 0)
    assert left == []
    with pymysql.connect(**mysql_kwargs) as conn, conn.cursor() as cur:
        cur.execute("SHOW TABLES LIKE %s", ("bench_breadth_%",))
        assert cur.fetchall() == ()
