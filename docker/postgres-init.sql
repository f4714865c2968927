-- airflow_eo's own database and user on the compose PostgreSQL (beside Airflow's metadata database).
CREATE ROLE airflow_eo LOGIN PASSWORD 'airflow_eo';
CREATE DATABASE airflow_eo OWNER airflow_eo;
