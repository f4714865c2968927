"""Where a Spark task keeps files of its own (a dead-letter spill, a bulk load's CSV files)."""

from __future__ import annotations

import os


def task_folder() -> str | None:
    """The executor's block manager folder (``SPARK_LOCAL_DIRS``, which Spark gives its Python workers and removes
    when the executor stops), else None: the system's temporary folder. Under ``/tmp`` itself, a task killed with
    its executor left its files behind for good (seen: 192 dead-letter spills and 20 staging CSV files after a day
    of crash tests)."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return local if local and os.path.isdir(local) else None
