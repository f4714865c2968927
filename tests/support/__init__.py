"""Test plumbing shared by the tests, the demo and the benchmark (not shipped with the package)."""

from pathlib import Path

#: The repository's root folder.
REPO = Path(__file__).resolve().parents[2]
