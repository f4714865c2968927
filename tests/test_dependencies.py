"""Dependencies with known vulnerabilities are excluded by the package's own requirements."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import tomllib
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parent.parent
#: package -> versions with a published advisory that the requirement must exclude
VULNERABLE = {"pymysql": ["1.0.2", "1.1.0"]}  # CVE-2024-36039: JSON keys not escaped (SQL injection)


def test_the_requirements_exclude_vulnerable_versions_and_the_pinned_ones_are_allowed():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    # The database drivers are extras (mysql, postgres): a requirement there counts as much.
    listed = [*project["project"]["dependencies"],
              *(r for extra in project["project"]["optional-dependencies"].values() for r in extra)]
    requirements = {Requirement(r).name.lower(): Requirement(r) for r in listed if not r.startswith("airflow-eo")}
    pins = dict(line.split("==", 1) for line in (REPO_ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    pinned = {name.lower(): version.strip() for name, version in pins.items()}
    for name, versions in VULNERABLE.items():
        spec = requirements[name].specifier
        assert not [v for v in versions if spec.contains(v)], f"{name}{spec} allows {versions}"
        assert spec.contains(pinned[name]), f"constraints.txt pins {name}=={pinned[name]}, outside {spec}"


# --------------------------------------------------------------------------- pip-audit of constraints.txt

#: What pip-audit prints when it cannot reach the advisory service (a network hiccup, an offline machine).
_UNREACHABLE = ("ConnectionError", "ConnectTimeout", "ReadTimeout", "Max retries exceeded", "Failed to resolve",
                "Name or service not known", "Temporary failure in name resolution", "Network is unreachable")


def pinned_requirements() -> list[str]:
    """constraints.txt as exact pins: its ``==`` lines, and the installed version of every other one (``pandas<3``)."""
    lines = []
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        lines.append(line if "==" in line else f"{requirement.name}=={metadata.version(requirement.name)}")
    return lines


def audit_verdict(report: dict[str, Any]) -> tuple[list[str], list[str]]:
    """pip-audit's JSON report -> (known vulnerabilities, packages it could not audit, with why)."""
    vulnerable = [f"{d['name']}=={d['version']}: {', '.join(v['id'] for v in d['vulns'])}"
                  for d in report.get("dependencies", []) if d.get("vulns")]
    skipped = [f"{d['name']}: {d['skip_reason']}" for d in report.get("dependencies", []) if d.get("skip_reason")]
    return vulnerable, skipped


def pip_audit(requirements: list[str], tmp_path: Path) -> tuple[list[str], list[str]]:
    """Run pip-audit on exact pins against PyPI's advisories; skip (printed by ``pytest -ra``) when they cannot be
    reached, never silently pass."""
    audit = Path(sys.executable).parent / "pip-audit"
    if not audit.exists():
        pytest.fail("pip-audit is not installed: it is in the test extras (pip install -e '.[test]')")
    listed = tmp_path / "requirements.txt"
    listed.write_text("\n".join(requirements) + "\n")
    try:
        done = subprocess.run([str(audit), "-r", str(listed), "--no-deps", "--disable-pip", "--vulnerability-service",
                               "pypi", "--format", "json", "--progress-spinner", "off", "--timeout", "20"],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("pip-audit: PyPI's advisory service did not answer within 300 s; constraints.txt NOT audited")
    if done.returncode not in (0, 1) or not done.stdout.strip():
        if any(word in done.stderr for word in _UNREACHABLE):
            pytest.skip("pip-audit: PyPI's advisory service cannot be reached; constraints.txt NOT audited: "
                        + done.stderr.strip().splitlines()[-1][:300])
        pytest.fail(f"pip-audit failed ({done.returncode}): {done.stderr[-1500:]}")
    return audit_verdict(json.loads(done.stdout))


def test_the_verdict_fails_on_a_known_vulnerability_and_names_what_was_not_audited():
    report = {"dependencies": [
        {"name": "pymysql", "version": "1.1.0", "vulns": [{"id": "PYSEC-2024-60", "fix_versions": ["1.1.1"]}]},
        {"name": "fastavro", "version": "1.13.1", "vulns": []},
        {"name": "grimp", "skip_reason": "Dependency not found on PyPI and could not be audited: grimp (3.20)"}]}
    assert audit_verdict(report) == (["pymysql==1.1.0: PYSEC-2024-60"],
                                     ["grimp: Dependency not found on PyPI and could not be audited: grimp (3.20)"])


@pytest.mark.timeout(330)
def test_no_pinned_dependency_has_a_known_vulnerability(tmp_path):
    """pip-audit of constraints.txt (``make test``). Offline, or where the index answers no advisory, it skips and
    says so; a vulnerability found fails it."""
    vulnerable, skipped = pip_audit(pinned_requirements(), tmp_path)
    assert not vulnerable, f"known vulnerabilities in constraints.txt: {vulnerable}"
    if skipped:
        pytest.skip(f"pip-audit could not audit {len(skipped)} pinned package(s) (the advisory service did not "
                    f"answer for them): {'; '.join(skipped)[:600]}")
