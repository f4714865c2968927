"""What a sink kind can do, declared once, and the one way to ask an adapter for it (``docs/architecture.md``, "The
sink registry").

A kind declares its :class:`SinkCapabilities` when it registers (:func:`~airflow_eo.core.sink_kinds.register_sink`);
nothing else declares an ability: not the spec, not the adapter. The protocol, the engine, the operator, ``airflow
eo`` and the DAG tab read ``adapter.capabilities`` (the kind's, :class:`~airflow_eo.core.sink_kinds.KindAdapter`) and,
for an ability that comes with methods, ask for its role with :func:`role` / :func:`has_role`: a kind that declares
an ability whose role its adapter lacks is named in a clear error, never found by an ``AttributeError`` (nor passed
over by a ``getattr`` probe). ``tests/core/test_sink_abilities.py`` builds every registered kind's adapter and checks
that it has the role of every ability it declares, and no other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from airflow_eo.core.errors import ConfigurationError

if TYPE_CHECKING:
    from airflow_eo.core.batch import BatchContext, BatchRecord, PartitionWriter, WritePlan, WriteResult
    from airflow_eo.core.dedup import SeenAt
    from airflow_eo.core.value_checks import ValueRule
    from airflow_eo.core.xid import Xid

R = TypeVar("R")


@dataclass(frozen=True)
class SinkCapabilities:
    """What a sink kind can do; the questions the rest of airflow_eo asks instead of a class name."""

    # -- how a batch's output becomes visible (the protocol and the engine's write strategy)
    #: the sink's own commit is the commit point (a Kafka transaction carrying the offsets, a table format's commit);
    #: the store then mirrors it. False: the store's commit is the commit point
    owns_commit_point: bool = False
    #: readers see what ``write`` wrote before the commit point (replay-safe upserts, a table commit made in
    #: ``write``): the engine then finds bad records before it writes, when they must fail the batch
    writes_visible_before_commit: bool = False
    #: ``write`` itself commits, after the Spark job that writes the output and only when every task of that job
    #: succeeded (a table format's commit): a task that fails on a bad record then commits nothing
    commits_only_after_write_job: bool = False

    # -- what a pipeline may ask of it (checked when the DAG is parsed)
    #: its updates may add to a row or append (``add``, a Kafka topic): reprocessing offsets counts them twice
    accumulates: bool = False
    #: every write appends (a Kafka topic), rather than adding to a row's columns
    appends: bool = False
    #: it may run in interval mode, where cleared or backfilled intervals are replayed (overwriting updates only)
    interval_replay: bool = False
    #: it deletes rows for tombstones (``on_tombstone="delete"``)
    deletes: bool = False

    # -- abilities that come with a role of the adapter (:data:`ROLES`)
    #: it leaves prepared (in-doubt) branches (XA, ``PREPARE TRANSACTION``) that recovery resolves and status lists
    in_doubt_branches: bool = False
    #: it commits the consumed offsets to a Kafka consumer group in its own transaction (it owns the commit point)
    consumer_group: bool = False
    #: it writes bad records to a dead-letter table with the batch (``on_bad_record="dead_letter"``), its executors
    #: in a one-pass batch, and reads them back for ``airflow eo``
    dead_letters: bool = False
    #: it keeps the event ids a batch saw in its database, committed with the output (``dedup_key``)
    seen_ids: bool = False
    #: its commit point is a table format's own commit (Delta, Iceberg), whose log records each batch: recovery and
    #: status read it there
    table_commits: bool = False
    #: it knows values its table refuses (lengths, ranges, NUL, NOT NULL) before the write
    value_checks: bool = False
    #: its table may refuse a row only at the write (a constraint, a trigger); its writers then raise a refusal the
    #: engine isolates by probes
    refused_rows: bool = False
    #: it applies a change stream (``changes=``): keeps each key's last applied source position (and delete markers)
    #: in its database, written with the output, and writes a change only when it is newer
    applies_changes: bool = False
    #: it applies a change stream in its own table commit (a table format): each row carries the position of the
    #: change that wrote it in a column of the table, delete markers live in a side table of the same format
    merges_changes: bool = False

    # -- where it lives
    #: the Airflow connection type of its ``conn_id`` (``airflow eo`` may be given another connection of that type
    #: on the command line); where its branches and dead letters live
    connection_type: str = ""
    #: the registered driver (:mod:`airflow_eo.core.drivers`) its adapter needs; default: its connection type's
    driver: str = ""

    @property
    def required_driver(self) -> str:
        return self.driver or self.connection_type

    @property
    def takes_changes(self) -> bool:
        """Whether a pipeline may read a change stream into it (``changes=``), either way."""
        return self.applies_changes or self.merges_changes

    def abilities(self) -> frozenset[str]:
        """The names of the abilities with a role that this kind declares."""
        return frozenset(name for name in ROLES.values() if getattr(self, name))


# --------------------------------------------------------------------------- the roles, one per ability


@runtime_checkable
class InDoubtSink(Protocol):
    """``in_doubt_branches``: lists the pipeline's prepared branches (read-only)."""

    def in_doubt(self, pipeline_id: str) -> list[Xid]: ...


@runtime_checkable
class ConsumerGroupSink(Protocol):
    """``consumer_group``: the group's view of unfinished batches, and moving it (a rewind)."""

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]: ...
    def move_group_offsets(self, positions: Mapping[tuple[str, int], int]) -> None: ...
    def open_transactions(self) -> dict[tuple[str, int], tuple[int, int]]: ...


@runtime_checkable
class TableCommitSink(Protocol):
    """``table_commits``: which unfinished batches the table committed, and a line on the table (its latest
    version, the pipeline's last batch in it) for ``airflow eo status``."""

    def committed_batches(self, unfinished: Sequence[BatchRecord]) -> set[int]: ...
    def table_state(self, pipeline_id: str) -> str: ...


@runtime_checkable
class DeadLetterTable(Protocol):
    """``dead_letters``: the dead-letter table's partition writer (the executors write a one-pass batch's bad
    records, each task in its own branch or fenced transaction: :class:`~airflow_eo.core.batch.DeadLetterRoute`), and
    its rows read back (oldest offsets first; None when the table does not exist yet)."""

    def dead_letter_writer(self, batch: BatchContext) -> PartitionWriter:
        """The dead-letter table's partition writer for this batch's attempt; creates the table first when it is
        missing (DDL, on the driver, before any branch of the batch starts)."""
    def dead_letters(self, pipeline_id: str, batch_id: int | None, limit: int) -> list[dict[str, Any]] | None: ...


@runtime_checkable
class SeenIds(Protocol):
    """``seen_ids``: keeps the event ids of ``dedup_key`` (:mod:`airflow_eo.core.dedup`) in its database, written
    with the output so that they commit exactly when it does."""

    #: the output table's key (empty: every row appended); a ``dedup_key`` among them lets the write tasks mark copies
    key_columns: tuple[str, ...]

    def seen_id_writer(self, batch: BatchContext) -> PartitionWriter:
        """The seen-id table's partition writer for this batch's attempt (its own branch / fenced transaction per
        task, committed with the batch's); creates the table first when it is missing."""
    def seen_id_lookup(self, batch: BatchContext) -> Callable[[Iterable[bytes]], Mapping[bytes, SeenAt]]:
        """Where the given ids were seen by this pipeline's committed batches (picklable: the executors call it)."""
    def purge_seen_ids(self, pipeline_id: str, before_ms: int, limit: int) -> int:
        """Remove at most ``limit`` ids seen before ``before_ms``; how many went."""


@runtime_checkable
class ValueChecks(Protocol):
    """``value_checks``: the engine checks values the table refuses where the records are parsed, so that such a
    record is a bad record (``on_bad_record``), not a write that fails every run of the batch. Only the records of a
    batch without a transform are checked (a transform's output row is no one record)."""

    def value_rules(self, output: Sequence[tuple[str, str]]) -> Sequence[ValueRule]:
        """The rules of the ``output`` columns' values (name, Spark ``simpleString`` type)."""


@runtime_checkable
class RowRefusals(Protocol):
    """``refused_rows``: the output table may refuse a row only at the write; the engine then finds the records it
    refuses by probes (:mod:`airflow_eo.core.refused_rows`) and writes the batch again without them."""

    @property
    def output_table(self) -> str:
        """The table written, for messages."""
    def refused_by_output(self, writer: object) -> bool:
        """Whether a refusal raised by ``writer`` (a partition writer this sink made) is the output table's, whose
        rows are the batch's records (not the dead-letter or seen-id table's)."""
    def void_refused_write(self, batch: BatchContext) -> None:
        """Roll back what the refused write job's tasks prepared, before the probes and the next write
        (:func:`~airflow_eo.core.two_phase.refused_write_branches`)."""


@runtime_checkable
class ChangePositions(Protocol):
    """``applies_changes``: the source positions of the changes applied to each key of the output table
    (:mod:`airflow_eo.core.changes`), in the sink's database, written with the output so that they commit when it
    does."""

    #: the output table's key: a change names its row by it
    key_columns: tuple[str, ...]

    def position_writer(self, batch: BatchContext) -> PartitionWriter:
        """The change-position table's partition writer for this batch's attempt (its own branch / fenced transaction
        per task, written after the task's output); creates the table first when it is missing."""
    def position_lookup(self, batch: BatchContext) -> Callable[[Iterable[bytes]], Mapping[bytes, bytes]]:
        """The applied positions of the given key ids (picklable: the executors call it)."""
    def purge_delete_markers(self, pipeline_id: str, before_ms: int, limit: int) -> int:
        """Remove at most ``limit`` delete markers of changes older than ``before_ms``; how many went."""
    def truncate_target(self, batch: BatchContext, position: bytes) -> bool:
        """A truncate of the source at ``position`` (``on_truncate="truncate"``): unless the pipeline's truncate
        floor is that new already, delete every row of the output table and set the floor, in one transaction of
        this attempt (fenced); whether it did."""


@runtime_checkable
class ChangeMerges(Protocol):
    """``merges_changes``: a batch of changes (the row's columns, :data:`~airflow_eo.core.config.DELETE_COLUMN`,
    :data:`~airflow_eo.core.changes.POSITION_COLUMN` and the record's Kafka timestamp) applied in the table's own
    commit, the batch's commit point: per key the newest change, when newer than the row's position (a column of the
    table) and than the key's delete marker (:mod:`airflow_eo.core.changes`)."""

    #: the output table's key: a change names its row by it
    key_columns: tuple[str, ...]

    def write_changes(self, plan: WritePlan, batch: BatchContext) -> WriteResult:
        """Like ``Sink.write`` (the commit point), for a batch of changes."""


#: every role, and the ability that comes with it
ROLES: dict[type, str] = {
    InDoubtSink: "in_doubt_branches",
    ConsumerGroupSink: "consumer_group",
    TableCommitSink: "table_commits",
    DeadLetterTable: "dead_letters",
    SeenIds: "seen_ids",
    ValueChecks: "value_checks",
    RowRefusals: "refused_rows",
    ChangePositions: "applies_changes",
    ChangeMerges: "merges_changes",
}
_ABILITY_FIELDS = {f.name for f in fields(SinkCapabilities)}
if not set(ROLES.values()) <= _ABILITY_FIELDS:  # a typo here would make an ability unaskable
    raise ImportError(f"abilities without a SinkCapabilities field: {set(ROLES.values()) - _ABILITY_FIELDS}")


class HasCapabilities(Protocol):
    """An adapter as :func:`role` asks it: its kind's name and capabilities."""

    name: str

    @property
    def capabilities(self) -> SinkCapabilities: ...


def lacks_role(kind: str, capability: str, wanted: type, adapter: object) -> ConfigurationError:
    """The error of a sink kind that declares ``capability`` while the adapter its factory built lacks the role that
    goes with it (``wanted``): the kind's registration and its adapter disagree."""
    missing = sorted(name for name in role_members(wanted) if not hasattr(adapter, name))
    lacking = f" (it has no {', '.join(missing)})" if missing else ""
    return ConfigurationError(
        f"sink kind {kind!r} declares the {capability!r} capability, but its adapter "
        f"{type(adapter).__module__}.{type(adapter).__qualname__} does not implement {wanted.__name__}{lacking}: "
        f"the kind's factory must build an adapter with that role, or its registration must not declare "
        f"{capability!r}")


def role_members(wanted: type) -> list[str]:
    """The public members of a role (what an adapter implementing it has)."""
    names = {*vars(wanted), *getattr(wanted, "__annotations__", {})}
    return sorted(name for name in names if not name.startswith("_"))


def has_role(adapter: HasCapabilities, wanted: type[R]) -> bool:
    """Whether the adapter's kind declares the ability of role ``wanted``; a kind that declares it while its adapter
    lacks the role is refused (:func:`lacks_role`)."""
    ability = ROLES[wanted]
    if not getattr(adapter.capabilities, ability):
        return False
    if not isinstance(adapter, wanted):
        raise lacks_role(adapter.name, ability, wanted, adapter)
    return True


def role(adapter: HasCapabilities, wanted: type[R], needed_for: str = "") -> R:
    """``adapter`` as its role ``wanted``: a kind without that ability is refused with a clear error (``needed_for``
    says what asked: ``dedup_key``), as is one whose adapter lacks the role of an ability it declares."""
    if not has_role(adapter, wanted):
        why = f" ({needed_for})" if needed_for else ""
        raise ConfigurationError(f"sink kind {adapter.name!r} does not have the {ROLES[wanted]!r} capability{why}")
    return cast(R, adapter)  # has_role checked isinstance(adapter, wanted)


def roles_implemented(adapter: object) -> frozenset[str]:
    """The abilities whose role ``adapter`` implements (for the check that a kind declares exactly those)."""
    return frozenset(ability for wanted, ability in ROLES.items() if isinstance(adapter, wanted))


def no_dead_letters(name: str, records: Iterator[Any]) -> list[str]:
    """``write_dead_letters`` of a sink that keeps none: :func:`~airflow_eo.core.config.check_pipeline` refuses
    ``on_bad_record="dead_letter"`` with it when the DAG is parsed, so a bad record reaching it is an error (not an
    assert: ``python -O`` would drop the bad records silently)."""
    if next(records, None) is not None:
        raise ConfigurationError(f"{name} keeps no dead letters: on_bad_record='dead_letter' cannot run with it "
                                 "(the batch is not committed)")
    return []
