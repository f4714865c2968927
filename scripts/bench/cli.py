"""The command line of ``scripts/benchmark.py``: the sweep (each point in a process of its own) and the
internal calls of its child processes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from bench.common import SCRIPT, SETTINGS
from bench.lakehouse import delta_point, iceberg_point
from bench.limits import r_db
from bench.names import EMPTY_BATCH, LIMITS, OURS, PEERS
from bench.ours import empty_batch_in_this_process
from bench.point import run_point
from bench.report import chart, print_point, print_scale_out, rate_point


def main(description: str) -> None:
    """``description``: scripts/benchmark.py's docstring, whose first paragraph ``--help`` shows."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000", help="comma-separated batch sizes (events), e.g. 10000,100000")
    parser.add_argument("--parallelism", default="2", help="comma-separated writer parallelism (tasks, connections)")
    parser.add_argument("--only", default="",
                        help=f"comma-separated jobs among {', '.join((*LIMITS, *PEERS, *OURS, EMPTY_BATCH))}")
    parser.add_argument("--spark-conn", default=None,
                        help="the Airflow connection of the Spark to run on, e.g. spark_cluster (`make spark-cluster`, "
                             "then `. .stack/spark/env`); default: local")
    parser.add_argument("--cdc-phases", action="store_true",
                        help="after each of our change-data-capture jobs, run its stages apart (untimed) to report "
                             "where its time goes (phases p_read, p_parse, p_newest, p_lookup)")
    parser.add_argument("--json", type=Path, help="write the results here (one object per job)")
    parser.add_argument("--chart", type=Path, help="write a PNG chart of records/s here (needs matplotlib)")
    parser.add_argument("--point", help=argparse.SUPPRESS)  # internal: run one point, print its JSON
    parser.add_argument("--r-db", help=argparse.SUPPRESS)  # internal: run r_db, print its JSON
    parser.add_argument("--empty-batch", help=argparse.SUPPRESS)  # internal: time empty batches, print the JSON
    parser.add_argument("--delta", help=argparse.SUPPRESS)  # internal: run the Delta jobs, print their JSON
    parser.add_argument("--iceberg", help=argparse.SUPPRESS)  # internal: the same for the Iceberg jobs
    args = parser.parse_args()
    SETTINGS.spark_conn_id, SETTINGS.cdc_phases = args.spark_conn, args.cdc_phases
    only = [o for o in args.only.split(",") if o]
    if args.empty_batch:
        topic, parallelism = args.empty_batch.rsplit(":", 1)
        job = empty_batch_in_this_process(topic, int(parallelism))
        print("EMPTY " + json.dumps({k: v for k, v in asdict(job).items() if k != "records_per_s"}), flush=True)
        return
    for fmt, point in (("delta", delta_point), ("iceberg", iceberg_point)):
        if getattr(args, fmt):
            topic, events, parallelism, names, workdir = getattr(args, fmt).split(":", 4)
            Path(workdir).mkdir(parents=True, exist_ok=True)
            found = point(topic, int(events), int(parallelism), Path(workdir), names.split(","))
            print(f"{fmt.upper()} " + json.dumps([{k: v for k, v in asdict(job).items() if k != "records_per_s"}
                                                   for job in found]), flush=True)
            return
    if args.r_db:
        database, topic, events, parallelism, workdir = args.r_db.split(":", 4)
        job = r_db(topic, int(events), int(parallelism), Path(workdir), database)
        print("RDB " + json.dumps({k: v for k, v in asdict(job).items() if k != "records_per_s"}), flush=True)
        return
    if args.point:
        events, parallelism = (int(v) for v in args.point.split(":"))
        result = run_point(events, parallelism, only)
        print("POINT " + json.dumps(result), flush=True)
        return
    points = []
    for events in (int(s) for s in args.sizes.split(",")):
        for parallelism in (int(p) for p in args.parallelism.split(",")):
            # Its own process: the driver's peak memory and JVM are this point's alone.
            where = ["--spark-conn", args.spark_conn] if args.spark_conn else []
            child = subprocess.run([sys.executable, str(SCRIPT), "--point", f"{events}:{parallelism}",
                                    "--only", args.only, *where, *(["--cdc-phases"] if args.cdc_phases else [])],
                                   stdout=subprocess.PIPE, text=True)
            lines = child.stdout.splitlines()
            print("\n".join(line for line in lines if not line.startswith("POINT ")), flush=True)
            if child.returncode != 0:
                sys.exit(f"the point {events}:{parallelism} failed (exit {child.returncode})")
            point = json.loads(next(line for line in lines if line.startswith("POINT "))[6:])
            rate_point(point)
            points.append(point)
            print_point(point)
    if len({p["parallelism"] for p in points}) > 1:
        print_scale_out(points)
    if args.json:
        jobs = [job for p in points for job in p["jobs"]]
        args.json.write_text(json.dumps(jobs, indent=1))
        print(f"json: {args.json} ({len(jobs)} jobs)")
    if args.chart:
        chart(points, args.chart)
