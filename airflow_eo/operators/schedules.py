"""What the micro-batch operator checks of its DAG's schedule when the DAG is parsed."""

from __future__ import annotations

from typing import Any

from airflow_eo.core.errors import ConfigurationError


def check_timetable_has_intervals(timetable: Any, dag_id: str) -> None:
    """Airflow 3's cron/delta *trigger* timetables give runs a zero-length data interval by default; runs started by
    asset events (``schedule=[Asset(...)]``, ``AssetOrTimeSchedule``) have none (``data_interval=None``)."""
    if any(kind.__name__ == "AssetTriggeredTimetable" for kind in type(timetable).__mro__):
        raise ConfigurationError(
            f"DAG {dag_id!r}: mode='interval' processes a run's data interval, and the runs this schedule starts on "
            "asset events (an AssetWatcher such as EoBacklogTrigger's, or another DAG's asset) have none. For runs "
            "when data arrives use mode='continuous' (each run takes what arrived since the last batch); keep "
            "interval mode, and its backfills, on a time schedule (docs/how-to/event-driven-runs.md)."
        )
    if type(timetable).__name__.endswith("TriggerTimetable") and not getattr(timetable, "interval", None):
        raise ConfigurationError(
            f"DAG {dag_id!r}: mode='interval' needs runs with a data interval, but this schedule "
            f"({type(timetable).__name__}) gives each run a zero-length one. Use e.g. "
            "schedule=CronDataIntervalTimetable('@hourly', timezone='UTC'), or CronTriggerTimetable(..., "
            "interval=timedelta(hours=1))."
        )
