"""Hooks: Airflow connections → the adapters that do the I/O."""
