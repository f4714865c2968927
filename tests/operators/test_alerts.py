"""The deadline alert names the pipeline the run served (its conf's ``pipeline_id``), not only the DAG's default."""

from __future__ import annotations

from airflow_eo.operators.alerts import pipeline_of_run


def test_the_runs_conf_names_the_pipeline_else_the_default():
    assert pipeline_of_run("page_view_events_upsert", {"conf": {"pipeline_id": "page_views_xa"}}, "pipeline_id") \
        == "page_views_xa"
    assert pipeline_of_run("page_view_events_upsert", {"conf": {}}, "pipeline_id") == "page_view_events_upsert"
    assert pipeline_of_run("page_view_events_upsert", {"conf": None}, "pipeline_id") == "page_view_events_upsert"
    assert pipeline_of_run("default", {"conf": {"pipeline": "x"}}, "pipeline") == "x"  # another key, if the DAG's
    assert pipeline_of_run("default", {"conf": {"pipeline_id": "x"}}, None) == "default"  # never from the conf


def test_a_conf_value_that_is_no_pipeline_id_is_not_named():
    assert pipeline_of_run("default", {"conf": {"pipeline_id": "no spaces; DROP"}}, "pipeline_id") == "default"
    assert pipeline_of_run("default", {"conf": {"pipeline_id": "x" * 500}}, "pipeline_id") == "default"
