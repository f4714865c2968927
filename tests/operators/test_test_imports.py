"""No test module imports another test module or a conftest: what tests share lives in ``tests/support`` (an
import of a test module runs its module-level code and collects its tests twice under another name)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


def test_no_test_module_imports_a_test_module_or_a_conftest():
    found = [f"{path.relative_to(TESTS.parent)}: {name}" for path in sorted(TESTS.rglob("*.py"))
             for name in _imported(ast.parse(path.read_text(), str(path)))
             if name.startswith("tests.") and (name.rsplit(".", 1)[-1].startswith("test_")
                                               or name.rsplit(".", 1)[-1] == "conftest")]
    assert found == [], "move what they share into tests/support:\n" + "\n".join(found)
