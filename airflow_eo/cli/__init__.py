"""``airflow eo ...``: operating pipelines from Airflow's own CLI (see ``definition.py``)."""
