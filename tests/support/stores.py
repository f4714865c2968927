"""The tests' offset stores other than PostgreSQL's (``PG_STORE`` is in :mod:`tests.support.postgres`): their
connection ids."""

from __future__ import annotations

#: The stack's MariaDB offset store (the operator's default ``offset_store_conn_id``).
MYSQL_STORE = "eo_offset_store"
