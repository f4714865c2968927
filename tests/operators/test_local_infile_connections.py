"""``LOAD DATA LOCAL`` is offered to a server only through ``airflow_eo.mysql.connection.connect``, whose
connections answer a file request only for the file being loaded (a plain pymysql ``local_infile`` connection sends
whichever file the server names, on any statement)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def plain_local_infile_calls(path: Path) -> list[str]:
    """Calls of ``pymysql.connect``/``pymysql.Connection``/``connections.Connection`` with a ``local_infile``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not any(k.arg == "local_infile" for k in node.keywords):
            continue
        name = ast.unparse(node.func)
        if name.startswith("pymysql.") or name in ("Connection", "connections.Connection"):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}(..., local_infile=...)")
    return found


def test_no_code_of_ours_opens_a_plain_pymysql_connection_with_local_infile():
    files = [p for folder in ("airflow_eo", "scripts", "examples", "dags") for p in (REPO / folder).rglob("*.py")]
    assert len(files) > 20
    assert [call for path in files for call in plain_local_infile_calls(path)] == []
