"""The Airflow UI plugin of airflow_eo: the "Exactly-once" tab on the DAG page (read-only)."""
