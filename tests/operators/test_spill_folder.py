"""Where a Spark task keeps its files: dead-letter spills, bulk-load CSV files (``core/task_files.py``)."""

from __future__ import annotations


def test_a_tasks_spill_goes_to_the_executors_own_folder_when_spark_names_one(tmp_path, monkeypatch):
    from airflow_eo.core.task_files import task_folder

    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/elsewhere")
    assert task_folder() == str(tmp_path)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "gone"))
    assert task_folder() is None  # the system's temporary folder
