"""The SQL table sink written once (``docs/architecture.md``, "Sinks", and "The recipe for a new database"): the
adapters, the dead letters, the column upgrades and the migrations' skeleton, over one
:class:`~airflow_eo.sqlsink.database.SqlDatabase` descriptor per database (in the database's own folder)."""
