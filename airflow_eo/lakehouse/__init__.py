"""What the table-format rooms share (``delta/``, ``iceberg/``; ``docs/architecture.md``, "Sinks"): a table sink
whose format's own commit, made inside ``write``, is the batch's commit point.

``specs.py`` holds the spec base (append, or ``MERGE`` on ``key_columns`` whose ``updates`` replace or add) and the
capabilities every table-format kind declares; ``adapter.py`` the protocol steps around a table commit (recovery
that rolls forward the batches the table has, commit retries against other writers) and the Spark parts both
formats build their write from (one row per key in offset order, the ``MERGE`` clauses). A format's folder keeps
only what differs: how it names a batch in the table, how it commits, how it reads its log. Knows no format and
imports no format's library (``pyproject.toml``'s import contracts).
"""
