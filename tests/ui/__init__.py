"""The Exactly-once tab of the Airflow UI, in a real browser."""
