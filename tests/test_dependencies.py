"""Dependencies with known vulnerabilities are excluded by the package's own requirements."""

from __future__ import annotations

from pathlib import Path

import tomllib
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parent.parent
#: package -> versions with a published advisory that the requirement must exclude
VULNERABLE = {"pymysql": ["1.0.2", "1.1.0"]}  # CVE-2024-36039: JSON keys not escaped (SQL injection)


def test_the_requirements_exclude_vulnerable_versions_and_the_pinned_ones_are_allowed():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    requirements = {Requirement(r).name.lower(): Requirement(r) for r in project["project"]["dependencies"]}
    pins = dict(line.split("==", 1) for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    pinned = {name.lower(): version.strip() for name, version in pins.items()}
    for name, versions in VULNERABLE.items():
        spec = requirements[name].specifier
        assert not [v for v in versions if spec.contains(v)], f"{name}{spec} allows {versions}"
        assert spec.contains(pinned[name]), f"constraints.txt pins {name}=={pinned[name]}, outside {spec}"
