"""The spec base of a table-format sink kind and what every such kind can do (parse time, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_eo.core.abilities import SinkCapabilities
from airflow_eo.core.config import UpdateMode
from airflow_eo.core.sink_kinds import SinkSpec


def table_commit_capabilities(driver: str) -> SinkCapabilities:
    """What a table-format kind can do: its commit, made in ``write`` after the job that writes its files and only
    if every task of it succeeded, is the commit point (a task that fails on a bad record commits nothing); appends
    and ``add`` updates accumulate; a replayed interval finds its commit in the table; with ``key_columns``, a change
    stream is merged in the same commit (``airflow_eo/lakehouse/changes.py``).

    :param driver: the registered driver that reads the table's log on the Airflow worker (``delta``: deltalake,
        ``iceberg``: pyiceberg).
    """
    return SinkCapabilities(owns_commit_point=True, writes_visible_before_commit=True,
                            commits_only_after_write_job=True, accumulates=True, appends=True, interval_replay=True,
                            table_commits=True, merges_changes=True, driver=driver)


class LakehouseTableSpec(SinkSpec):
    """A lakehouse table sink's spec (Delta, Iceberg): appends without ``key_columns``, else a ``MERGE`` whose
    ``updates`` replace or add; a batch is one table commit that names the batch, found again by a replay."""

    key_columns: Sequence[str]
    updates: Mapping[str, UpdateMode | str]

    @property
    def row_key(self) -> tuple[str, ...]:
        return tuple(self.key_columns)

    @property
    def accumulating(self) -> bool:
        """Appends and ``add`` updates count reprocessed offsets twice (a rewind); a replay of the same batch is
        skipped by the table itself."""
        return not self.key_columns or any(m is UpdateMode.ADD for m in self.updates.values())

    @property
    def replay_safe(self) -> bool:
        # A cleared or backfilled interval replays its recorded batch: the table has that batch's commit under the
        # interval's identity, so nothing is written again, whatever the updates do.
        return True
