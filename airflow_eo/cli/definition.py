"""The ``airflow eo`` command group, registered through the provider info's ``"cli"`` entry (Airflow >= 3.2).

Airflow imports this module whenever its CLI starts, so it imports only ``airflow.cli.cli_config``;
the commands themselves (``airflow_eo/cli/commands.py``) load when one runs.
"""

from __future__ import annotations

from airflow.cli.cli_config import (
    ARG_OUTPUT,
    ARG_VERBOSE,
    ActionCommand,
    Arg,
    GroupCommand,
    lazy_load_command,
    positive_int,
)

DOUBLE_COUNT_FLAG = "--i-understand-reprocessing-double-counts"

ARG_PIPELINE = Arg(("pipeline_id",), help="The pipeline's id in the offset store (`airflow eo pipelines` lists them)")
ARG_PIPELINE_OR_ALL = Arg(("pipeline_id",), nargs="?", default=None,
                          help="The pipeline's id in the offset store (`airflow eo pipelines` lists them)")
ARG_VERIFY_ALL = Arg(("--all",), action="store_true",
                     help="Instead of one pipeline: every in-doubt branch carrying our prefix (XA branches, "
                          "PostgreSQL prepared transactions) on every database the store's pipelines recorded as "
                          "their sink's, and the open transactions on every Kafka-sink pipeline's output topic, with "
                          "its pipeline (or 'unknown pipeline'), batch, age, locks (where the database says) and what "
                          "the store decides; exit code 1 when one is older than --older-than, 2 when a database "
                          "could not be scanned")
ARG_OLDER_THAN = Arg(("--older-than",), default=None, metavar="DURATION",
                     help="Seconds, or a number with a unit s, m, h, d (10m, 2h); 0: every branch. --all: exit code 1 "
                          "when a branch is older; --orphans: only older branches are resolved (default: 10m)")
ARG_ORPHANS = Arg(("--orphans",), action="store_true",
                  help="Instead of one pipeline: every in-doubt branch of ours on the store's sink databases, "
                       "decided by the store as recover decides a pipeline's, under each pipeline's epoch, audited "
                       "(a Kafka-sink pipeline's open transaction: its recover); two scans --scan-interval apart, "
                       "and only branches both list and older than --older-than")
ARG_UNKNOWN = Arg(("--unknown",), choices=("leave", "rollback"), default=None,
                  help="--orphans: what becomes of a branch whose pipeline the store never knew (default: leave)")
ARG_SCAN_INTERVAL = Arg(("--scan-interval",), type=float, default=5.0, metavar="SECONDS",
                        help="--orphans: seconds between the two scans (default: 5)")
ARG_OFFSET_STORE_CONN = Arg(("--offset-store-conn-id",), default=None,
                            help="Airflow mysql (MySQL / MariaDB) or postgres (PostgreSQL) connection of the offset "
                                 "store (default: [eo] offset_store_conn_id, else eo_offset_store)")
ARG_KAFKA_CONN = Arg(("--kafka-conn-id",), default=None,
                     help="Airflow kafka connection of the source cluster (default: [eo] kafka_conn_id, "
                          "else kafka_default)")
ARG_SINK_CONN = Arg(("--sink-conn-id",), default=None,
                    help="Airflow connection of the sink's database, for in-doubt branches (MySQL XA, PostgreSQL "
                         "prepared transactions) and dead letters, whatever the sink's kind: a connection of the type "
                         "its kind registered (mysql, postgres, kafka). Default: the connection the pipeline's sink "
                         "declared, as recorded in the store")
ARG_MYSQL_CONN = Arg(("--mysql-conn-id",), default=None,
                     help="Deprecated: use --sink-conn-id (which wins when both are given). The connection of a "
                          "MySQL / MariaDB sink's database only; other sinks use the connection they declared")
ARG_HISTORY_LIMIT = Arg(("--limit",), type=positive_int(allow_zero=False), default=20,
                        help="Show at most this many batches and audit entries (default: 20)")
ARG_DEAD_LETTER_LIMIT = Arg(("--limit",), type=positive_int(allow_zero=False), default=100,
                            help="Show at most this many dead letters (default: 100)")
ARG_BATCH = Arg(("--batch",), type=positive_int(allow_zero=True), default=None, metavar="BATCH_ID",
                help="Only this batch's dead letters")
ARG_RECOVER_DRY_RUN = Arg(("--dry-run",), action="store_true", help="Only show what recovery would do (the default)")
ARG_RECOVER_APPLY = Arg(("--apply",), action="store_true",
                        help="Do it. Without it the command is a dry run: it shows what recovery would do with each "
                             "in-doubt branch and unfinished batch, and changes nothing")
ARG_REASON = Arg(("--reason",), default=None, help="Why (recorded in the audit log; required by --apply)")
ARG_TO_EARLIEST = Arg(("--to-earliest",), action="store_true",
                      help="Move every partition to its log-start offset (the oldest record still stored)")
ARG_TO_LATEST = Arg(("--to-latest",), action="store_true",
                    help="Move every partition to its last stable offset (skip everything not processed yet)")
ARG_TO_DATETIME = Arg(("--to-datetime",), metavar="TIME",
                      help="Move every partition to its first record at or after TIME (ISO 8601, e.g. "
                           "2026-11-20T08:00:00+00:00; without a time zone: UTC)")
ARG_TO_OFFSETS = Arg(("--to-offsets",), metavar="JSON",
                     help='Move the partitions named to these offsets: \'{"topic": {"0": 42, "1": 7}}\'')
ARG_APPLY = Arg(("--apply",), action="store_true",
                help="Change the offsets. Without it the command is a dry run: it shows old -> new per partition "
                     "and what will be reprocessed or skipped, and changes nothing")
ARG_REWIND_DRY_RUN = Arg(("--dry-run",), action="store_true", help="Show the plan only (the default)")
ARG_DOUBLE_COUNT = Arg((DOUBLE_COUNT_FLAG,), action="store_true", dest="allow_double_count",
                       help="Rewind a pipeline whose sink accumulates (XA or two-phase sink with 'add' updates, "
                            "Kafka sink) although reprocessing counts the rewound records twice")

ARG_IDLE_FOR = Arg(("--idle-for",), default=None, metavar="DURATION",
                   help="How long the pipeline must have been quiet (no epoch taken, no batch written) to count as not "
                        "running: seconds, or a number with a unit s, m, h, d (default: 10m). A run whose Spark job "
                        "takes longer between two writes of the store needs more")
ARG_DEAD_LETTERS = Arg(("--dead-letters",), action="store_true",
                       help="Remove the pipeline's dead letters too (kept by default)")
ARG_UNDO = Arg(("--undo",), action="store_true",
               help="Bring a retired pipeline back: its next run continues from its committed offsets (a dry run "
                    "unless --apply --reason)")
ARG_SEED_OFFSETS = Arg(("--to-offsets",), required=True, metavar="JSON",
                       help="The next offset to read of every partition of its topics: "
                            '\'{"topic": {"0": 42, "1": 7}}\'')
ARG_NEW_PIPELINE = Arg(("new_pipeline_id",), help="The pipeline's new id (none in the store may have it)")
ARG_LIFECYCLE_APPLY = Arg(("--apply",), action="store_true",
                          help="Do it. Without it the command is a dry run: it shows what it would do and whether "
                               "it would be refused, and changes nothing")

ARG_RETENTION = Arg(("--older-than",), required=True, metavar="DURATION",
                    help="The retention: history last written longer ago goes (a number with a unit s, m, h, d, "
                         "e.g. 90d; at least 1d)")
CONNECTION_ARGS = (ARG_OFFSET_STORE_CONN, ARG_KAFKA_CONN, ARG_SINK_CONN, ARG_MYSQL_CONN)
COMMANDS_PATH = "airflow_eo.cli.commands"

EO_COMMANDS = (
    ActionCommand(
        name="pipelines",
        help="List every pipeline in the offset store",
        description="Every pipeline in the offset store: owner (DAG.task), mode, fencing epoch, sink, newest "
                    "batch (id, state, when) and total lag (offsets not processed yet).",
        func=lazy_load_command(f"{COMMANDS_PATH}.pipelines"),
        args=(*CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="status",
        help="Show a pipeline's partitions, unfinished batch and in-doubt branches",
        description="Per partition: committed offset, last stable offset, log-start offset and lag. The unfinished "
                    "batch, if any, and the pipeline's in-doubt (prepared) branches, MySQL XA branches or "
                    "PostgreSQL prepared transactions, with their age and what "
                    "recovery does with each: commit or roll back, and why.",
        func=lazy_load_command(f"{COMMANDS_PATH}.status"),
        args=(ARG_PIPELINE, *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="history",
        help="Show a pipeline's batches and audit log",
        description="The newest batches (id, run id, state, ranges, records in, rows out, dead letters, seconds "
                    "per phase, skipped ranges, resumed/replayed) and what people did to the pipeline (rewinds, "
                    "recoveries: who, when, why).",
        func=lazy_load_command(f"{COMMANDS_PATH}.history"),
        args=(ARG_PIPELINE, ARG_HISTORY_LIMIT, *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="recover",
        help="Resolve a pipeline's in-doubt branches and unfinished batches now (a dry run unless --apply)",
        description="Does now, exactly, what the pipeline's next task attempt does first: takes the pipeline's "
                    "epoch (fencing any running attempt), commits the prepared branches (XA, PostgreSQL prepared "
                    "transactions) of committed batches, rolls back "
                    "the others, rolls forward batches a Kafka sink committed and aborts every other unfinished "
                    "batch. A DRY RUN unless --apply, which needs --reason; the audit row is written with the epoch "
                    "take, before anything changes, and completed with what recovery did. With --orphans instead of "
                    "a pipeline: every in-doubt branch of ours on the store's sink databases, whatever pipeline "
                    "left it (see --orphans, --unknown, --older-than).",
        func=lazy_load_command(f"{COMMANDS_PATH}.recover"),
        args=(ARG_PIPELINE_OR_ALL, ARG_ORPHANS, ARG_UNKNOWN, ARG_OLDER_THAN, ARG_SCAN_INTERVAL, ARG_RECOVER_APPLY,
              ARG_RECOVER_DRY_RUN, ARG_REASON, *CONNECTION_ARGS, ARG_OUTPUT,
              ARG_VERBOSE),
    ),
    ActionCommand(
        name="rewind",
        help="Move a pipeline's committed offsets (a dry run unless --apply)",
        description="Moves the committed offsets to the earliest, the latest, a time or given offsets, so that "
                    "the next run reprocesses (moved back) or skips (moved forward) records. A DRY RUN unless "
                    "--apply: it shows old -> new per partition and what will be reprocessed or skipped. --apply "
                    "needs --reason, takes the pipeline's epoch (fencing any running attempt), refuses while a "
                    "batch is unfinished and, when it reprocesses, for sinks that accumulate ('add' updates, "
                    f"Kafka appends) unless {DOUBLE_COUNT_FLAG}; it is recorded in the audit log.",
        func=lazy_load_command(f"{COMMANDS_PATH}.rewind"),
        args=(ARG_PIPELINE, ARG_TO_EARLIEST, ARG_TO_LATEST, ARG_TO_DATETIME, ARG_TO_OFFSETS, ARG_APPLY,
              ARG_REWIND_DRY_RUN, ARG_REASON, ARG_DOUBLE_COUNT, *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="verify",
        help="Check that a pipeline's store, consumer group, sink and Airflow runs agree (read-only)",
        description="Read-only. Prints one line per finding: the committed batches tile every partition with no gap "
                    "and no overlap (except audited rewinds and skipped lost records) up to the committed offsets; "
                    "the consumer group airflow_eo.<pipeline> holds the store's committed offsets (continuous "
                    "mode); no prepared branch (XA, PostgreSQL prepared transaction) of a finished batch is open "
                    "and no Kafka transaction committed a batch the store has not; every run whose task succeeded "
                    "has its batch committed and every committed batch belongs to a run (or an audited recovery). "
                    "Exit code 1 with findings, 2 when a check could not run, else 0. With --all instead of a "
                    "pipeline: every in-doubt branch of ours on every database the store's pipelines recorded "
                    "(exit code 1 when one is older than --older-than).",
        func=lazy_load_command(f"{COMMANDS_PATH}.verify"),
        args=(ARG_PIPELINE_OR_ALL, ARG_VERIFY_ALL, ARG_OLDER_THAN, *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="retire",
        help="Retire a pipeline that never runs again (a dry run unless --apply)",
        description="Refused while a run may be going on (a batch planned or prepared, or the epoch taken, less "
                    "than --idle-for ago). --apply (with --reason) resolves its in-doubt work as `recover` does, marks "
                    "it retired (its row stays as a tombstone: a later run of the same pipeline id is refused until "
                    "`airflow eo retire PIPELINE --undo --apply --reason TEXT`), deletes its consumer group "
                    "airflow_eo.<pipeline>, removes the seen ids and change positions its sink keeps and, with "
                    "--dead-letters, its dead letters. Its offsets, batch history and audit log are kept. Audited.",
        func=lazy_load_command("airflow_eo.cli.lifecycle.retire"),
        args=(ARG_PIPELINE, ARG_DEAD_LETTERS, ARG_UNDO, ARG_IDLE_FOR, ARG_LIFECYCLE_APPLY, ARG_RECOVER_DRY_RUN,
              ARG_REASON, *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="rename",
        help="Give a pipeline a new id, keeping its offsets and history (a dry run unless --apply)",
        description="Moves the pipeline's offsets, batch history, audit log, its sink's seen ids, change positions "
                    "and dead letters, and its consumer group's offsets to NEW, in one store transaction under the "
                    "pipeline's lock (audited): the next batch of NEW continues exactly where OLD stopped. Set the "
                    "task's pipeline_id= to NEW. Refused while a run may be going on, while OLD has in-doubt work "
                    "(`airflow eo recover OLD --apply` first) and when NEW exists.",
        func=lazy_load_command("airflow_eo.cli.lifecycle.rename"),
        args=(ARG_PIPELINE, ARG_NEW_PIPELINE, ARG_IDLE_FOR, ARG_LIFECYCLE_APPLY, ARG_RECOVER_DRY_RUN, ARG_REASON,
              *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="seed",
        help="Give a pipeline that has not run in this store its starting offsets (a dry run unless --apply)",
        description="For a pipeline moved from another offset store (see the documentation, 'Moving a pipeline to "
                    "another store'): makes its row in this store and writes the next offset to read of every "
                    "partition of its topics (all of them must be named, within what the broker holds), audited as a "
                    "rewind of partitions never committed. Refused when the pipeline has run in this store (use "
                    "`rewind`) or is retired here.",
        func=lazy_load_command("airflow_eo.cli.lifecycle.seed"),
        args=(ARG_PIPELINE, ARG_SEED_OFFSETS, ARG_LIFECYCLE_APPLY, ARG_RECOVER_DRY_RUN, ARG_REASON,
              *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="prune",
        help="Remove the store's history beyond retention (a dry run unless --apply)",
        description="Removes committed and aborted batch-log rows, their dead letters and audit rows last written "
                    "before --older-than (at least 1d), of every pipeline or the one named, in statements of at most "
                    "500 rows (each its "
                    "own transaction). Never removed: a pipeline's last committed batch and every batch after it, "
                    "unfinished batches, batches an in-doubt branch names, interval-mode batches, audit rows newer "
                    "than the oldest batch kept, the newest prune's audit row. Each pipeline pruned is audited "
                    "(--apply needs --reason) with where its pruned batches left each partition (verify's tiling "
                    "starts there).",
        func=lazy_load_command("airflow_eo.cli.lifecycle.prune"),
        args=(ARG_PIPELINE_OR_ALL, ARG_RETENTION, ARG_LIFECYCLE_APPLY, ARG_RECOVER_DRY_RUN, ARG_REASON,
              *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="dead-letters",
        help="List a pipeline's dead letters",
        description="The records a pipeline with on_bad_record='dead_letter' could not parse, from its sink's "
                    "dead-letter table (eo_dead_letter unless the sink names another).",
        func=lazy_load_command(f"{COMMANDS_PATH}.dead_letters"),
        args=(ARG_PIPELINE, ARG_BATCH, ARG_DEAD_LETTER_LIMIT, *CONNECTION_ARGS, ARG_OUTPUT, ARG_VERBOSE),
    ),
)

EO_CLI_COMMANDS = [
    GroupCommand(
        name="eo",
        help="Operate airflow_eo pipelines (offsets, batches, recovery)",
        description="Inspect and repair the exactly-once Kafka micro-batch pipelines of airflow_eo: their "
                    "offsets and lag, batches, in-doubt XA branches and PostgreSQL prepared transactions, recovery, "
                    "rewinds and dead letters.",
        subcommands=EO_COMMANDS,
    ),
]


def get_eo_cli_commands() -> list[GroupCommand]:
    """The provider's CLI commands (provider info ``"cli"``)."""
    return EO_CLI_COMMANDS
