"""Example jobs of the DAGs in ``dags/``: schemas, transforms, table DDL and event producers."""
