"""Where a Spark task keeps its dead-letter spill (``airflow_eo.spark.engine.spill_folder``)."""

from __future__ import annotations


def test_a_tasks_spill_goes_to_the_executors_own_folder_when_spark_names_one(tmp_path, monkeypatch):
    from airflow_eo.spark.engine import spill_folder

    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/elsewhere")
    assert spill_folder() == str(tmp_path)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "gone"))
    assert spill_folder() is None  # the system's temporary folder
