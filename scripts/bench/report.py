"""The results: each job's line, the ratios of a point (to the best peer, to the limit), the table per point,
the scale-out over parallelisms and the chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import Job
from bench.names import COMPARED_WITH_PLAIN, DEAD_LETTERS, EVENTS_SHAPE, OURS, PEERS, PEERS_OF, PG_EVENTS_SHAPE


def print_job(job: Job) -> None:
    print(f"  {job.name:<36}{job.seconds:>8.1f}s {job.records_per_s:>12,.0f} records/s  "
          f"driver peak RSS {job.driver_peak_rss_mb}  {job.note}", flush=True)


def rate_point(point: dict[str, Any]) -> None:
    """Ratios within one point: to the best peer, to the limit of the job's shape."""
    jobs = {j["name"]: j for j in point["jobs"]}
    kafka, db = jobs.get("r_kafka", {}).get("records_per_s"), jobs.get("r_db", {}).get("records_per_s")
    good = jobs.get("eo_xa_events", {}).get("records_per_s")
    for job in point["jobs"]:
        shared: float | None = None
        peers = [p for p in PEERS_OF.get(job["name"], ()) if p in jobs]
        if peers:
            best = max(peers, key=lambda p: jobs[p]["records_per_s"])
            job["peer"] = best
            job["ratio_to_best_peer"] = round(job["records_per_s"] / jobs[best]["records_per_s"], 3)
        if job["name"] in COMPARED_WITH_PLAIN and good:
            job["ratio_to_good_records"] = round(job["records_per_s"] / good, 3)
        if job["name"] in EVENTS_SHAPE and kafka and db:
            limit, shared = min(kafka, db), shared_core_limit(kafka, db)
        elif job["name"] in PG_EVENTS_SHAPE and kafka and "r_db_pg" in jobs:
            db_pg = jobs["r_db_pg"]["records_per_s"]
            limit, shared = min(kafka, db_pg), shared_core_limit(kafka, db_pg)
        elif job["name"] in ("eo_xa_counts", "spark_jdbc_append_counts") and kafka:
            limit = kafka  # a few rows out: the database is not the limit
        elif job["name"] in ("eo_kafka_txn", "spark_kafka_writer") and "r_kafka_lines" in jobs:
            limit = jobs["r_kafka_lines"]["records_per_s"]
        else:
            continue
        job["fraction_of_limit"] = round(job["records_per_s"] / limit, 3)
        if shared is not None:
            job["fraction_of_shared_limit"] = round(job["records_per_s"] / shared, 3)


def shared_core_limit(r_kafka: float, r_db: float) -> float:
    """The rate of reading and writing a record when both take the same cores (Spark and the database share the
    machine's): each record costs 1/R_kafka to read plus 1/R_db to write, so 1 / (1/R_kafka + 1/R_db), below
    min(R_kafka, R_db), which holds only when the two run on cores of their own."""
    return 1 / (1 / r_kafka + 1 / r_db)


def print_point(point: dict[str, Any]) -> None:
    print(f"\n{point['events']:,} events, {point['parallelism']} writers, Spark: {point['spark']}")
    print(f"{'job':<36}{'seconds':>9}{'records/s':>12}{'x best peer':>22}{'best peer':>30}{'of limit':>10}"
          f"{'of shared':>10}{'protocol':>10}{'driver MiB (py/JVM)':>21}  phases (s)")
    for j in point["jobs"]:
        ratio = f"{j['ratio_to_best_peer']:.2f}" if j["ratio_to_best_peer"] is not None else "-"
        if j.get("ratio_to_good_records") is not None:
            ratio += f" ({j['ratio_to_good_records']:.2f}x {'good' if j['name'] in DEAD_LETTERS else 'plain'})"
        limit = f"{j['fraction_of_limit']:.2f}" if j["fraction_of_limit"] is not None else "-"
        shared = f"{j['fraction_of_shared_limit']:.2f}" if j.get("fraction_of_shared_limit") is not None else "-"
        protocol = f"{j['protocol_share']:.1%}" if j["protocol_share"] is not None else "-"
        rss = j["driver_peak_rss_mb"] or {}
        memory = f"{rss.get('python', '-')}/{rss.get('jvm', '-')}"
        print(f"{j['name']:<36}{j['seconds']:>9.1f}{j['records_per_s']:>12,.0f}{ratio:>22}{j.get('peer') or '-':>30}"
              f"{limit:>10}{shared:>10}{protocol:>10}{memory:>21}  {j['phases'] or j['note']}")


def print_scale_out(points: list[dict[str, Any]]) -> None:
    """Per batch size: each job's records/s at each parallelism, per writer task, and against the first one."""
    for events in sorted({p["events"] for p in points}):
        mine = sorted((p for p in points if p["events"] == events), key=lambda p: p["parallelism"])
        print(f"\nscale-out, {events:,} events on {mine[0]['spark']}: records/s (per writer task; x the first)")
        print(f"{'job':<36}" + "".join(f"{str(p['parallelism']) + ' writers':>32}" for p in mine))
        names = [j["name"] for j in mine[0]["jobs"] if j["records_per_s"]]
        for name in names:
            rates = [next((j["records_per_s"] for j in p["jobs"] if j["name"] == name), None) for p in mine]
            cells = [f"{r:>12,.0f} ({r / p['parallelism']:>8,.0f}; {r / rates[0]:.2f}x)" if r and rates[0] else "-"
                     for r, p in zip(rates, mine, strict=True)]
            print(f"{name:<36}" + "".join(f"{c:>32}" for c in cells))


def chart(points: list[dict[str, Any]], path: Path) -> None:
    """records/s per job against batch size, one panel per parallelism, the limit dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parallelisms = sorted({p["parallelism"] for p in points})
    # The legend beside the panel, and a colour per job: thirty-odd jobs hid the lines under an inner legend.
    fig, axes = plt.subplots(1, len(parallelisms), figsize=(11 * len(parallelisms), 7), squeeze=False)
    for ax, parallelism in zip(axes[0], parallelisms, strict=True):
        mine = sorted((p for p in points if p["parallelism"] == parallelism), key=lambda p: p["events"])
        sizes = [p["events"] for p in mine]
        names = [n for n in (*PEERS, *OURS) if any(j["name"] == n for p in mine for j in p["jobs"])]
        colours = plt.get_cmap("tab20")
        for n, name in enumerate(names):
            rates = [next((j["records_per_s"] for j in p["jobs"] if j["name"] == name), None) for p in mine]
            ax.plot(sizes, rates, marker="o", linestyle="-" if name in OURS else ":", label=name,
                    color=colours(n % 20), markersize=4)
        limits, shared_limits = [], []
        for p in mine:
            by_name = {j["name"]: j["records_per_s"] for j in p["jobs"]}
            both = {"r_kafka", "r_db"} <= set(by_name)
            limits.append(min(by_name["r_kafka"], by_name["r_db"]) if both else None)
            shared_limits.append(shared_core_limit(by_name["r_kafka"], by_name["r_db"]) if both else None)
        ax.plot(sizes, limits, color="black", linestyle="--", marker="_", markersize=14, linewidth=2,
                label="limit: min(R_kafka, R_db)")
        ax.plot(sizes, shared_limits, color="gray", linestyle="--", marker="_", markersize=14, linewidth=2,
                label="shared-core limit: 1 / (1/R_kafka + 1/R_db)")
        ax.set_xscale("log")
        ax.set_xlabel("events per batch")
        ax.set_ylabel("records/s")
        ax.set_title(f"{parallelism} writer tasks / connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"chart: {path}")
