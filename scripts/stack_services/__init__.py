"""The local stack's services, one module each, behind ``scripts/stack.py`` (its command line and the API its
loaders use: tests/support/stack.py, scripts/soak.py, scripts/spark_cluster.py).

``layout`` reads every setting of the environment (folders, ports) once, at import; ``processes`` starts, waits for
and stops a service's process; ``kafka``, ``mariadb``, ``postgres``: each server; ``env_file``: ``.stack/env``;
``airflow_db``: the Airflow metadata database; ``class_archive``: the Spark driver's class archive; ``connect``:
the Kafka Connect worker (scripts/stack_connect.py); ``faults``: kill and restart for the fault tests; ``cli``: the
commands. Nothing here imports more than the standard library at import (``make status`` runs before the venv).
"""
