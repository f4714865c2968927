"""Errors a user can act on. Every message says what happened and what to fix."""

from __future__ import annotations


class AirflowEoError(Exception):
    """Base class of every error raised by airflow_eo."""


class ConfigurationError(AirflowEoError):
    """The pipeline is misconfigured; raised before any side effect."""


class FencedError(AirflowEoError):
    """A newer attempt took the pipeline (its epoch moved on): this attempt must stop."""


class CommitConflictError(AirflowEoError):
    """A compare-and-set at the commit point found other offsets or batch state than planned."""


class TableMarkerError(AirflowEoError):
    """A table sink's table claims a batch of the pipeline above any the offset store planned (a marker another
    writer of the table set, or a store other than the one the table was written with): trusting it would skip
    every batch up to it, offsets advancing with nothing written."""


class DataLossError(AirflowEoError):
    """Records to process were deleted by retention before they were read."""


class UnavailableError(AirflowEoError):
    """A database or broker stayed unreachable (or leaderless) past its time limit; nothing was changed
    by the failing call, and the next attempt retries."""


class BadRecordError(AirflowEoError):
    """A record could not be parsed and ``on_bad_record='fail'``."""


class UnsupportedServerError(ConfigurationError):
    """The database server cannot keep XA branches safely (or lacks a needed privilege)."""


class IntervalNotReadyError(AirflowEoError):
    """Interval mode: the broker has not yet seen the end of the run's data interval on every partition."""


class PipelineConflictError(ConfigurationError):
    """A pipeline id is declared by two DAGs/tasks (or in two modes); refused before any side effect."""


class RetiredPipelineError(PipelineConflictError):
    """The pipeline id was retired (``airflow eo retire``); its run is refused before any side effect."""


class OperationError(AirflowEoError):
    """An operations command (``airflow eo ...``) refused or failed before changing anything."""


class UnknownPipelineError(OperationError):
    """The offset store has no pipeline of that id."""
