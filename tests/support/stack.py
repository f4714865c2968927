"""``scripts/stack.py`` (a script, not part of the package) as a module, for tests that start or kill its services."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def load_stack() -> ModuleType:
    """A fresh import of ``scripts/stack.py``: its folders and ports are read from the environment at import."""
    spec = importlib.util.spec_from_file_location("eo_stack", REPO / "scripts" / "stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def server_folder(prefix: str, as_user: dict[str, Any]) -> Path:
    """A new temporary folder for a throwaway PostgreSQL server that runs as ``as_user`` (``postgres`` when we are
    root; ``{}``: ourselves), owned by that user and reachable by it: in the temporary directory when that user can
    enter it, else (a ``TMPDIR`` inside a folder closed to others) under /var/tmp."""
    stack = load_stack()
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if not as_user:
        return folder
    os.chown(folder, as_user["user"], as_user["group"])
    if stack.reaches(folder, as_user):
        return folder
    folder.rmdir()
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    os.chown(folder, as_user["user"], as_user["group"])
    return folder
