"""The test harness (``tests/support``) stands on its own: it imports nothing from a test folder (``tests/integration``,
``tests/faults``, ...), so a test folder's files may move or go without breaking the harness the others share."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"


def _absolute(module: str | None, level: int, path: Path) -> str:
    """The absolute name ``from <level dots><module> import ...`` in ``path`` names."""
    if not level:
        return module or ""
    package = path.relative_to(TESTS.parent).with_suffix("").parts[:-1]  # ("tests", "support", ...)
    base = package[:len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, *([module] if module else [])])


def _test_folder_imports(path: Path) -> list[str]:
    """``line: module`` of every import in ``path`` (at any depth, relative ones resolved) of a ``tests`` module
    other than ``tests.support`` and its modules."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, path)
            # ``from tests import integration`` imports a folder too; ``from tests import REPO`` would not.
            names = ([f"tests.{alias.name}" for alias in node.names] if module == "tests" else [module])
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "tests" or len(parts) == 1 or parts[1] == "support":
                continue
            if not ((TESTS / parts[1]).is_dir() or (TESTS / f"{parts[1]}.py").is_file()):
                continue  # a name defined in tests/__init__.py (``from tests import REPO``), not a folder or module
            found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}: {name}")
    return found


def test_the_harness_imports_nothing_from_a_test_folder():
    files = sorted(SUPPORT.rglob("*.py"))
    assert files, f"no harness modules under {SUPPORT}"
    found = [line for path in files for line in _test_folder_imports(path)]
    assert not found, "tests/support imports from test folders (move the helper into tests/support):\n" + "\n".join(
        found)
