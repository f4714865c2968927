"""Triggers of airflow_eo (async, side-effect free, run by the triggerer)."""
