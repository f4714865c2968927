"""The documentation site (mkdocs.yml, docs/) and README.md, checked without services: the site builds with
``--strict`` (warnings, broken links and missing anchors fail), every Python sample parses and every complete DAG
sample builds its DAG, every ``airflow eo`` command line names a subcommand and options that exist, and the README
stays short with links that resolve."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"
sys.path.insert(0, str(REPO / "scripts"))

import docs_site  # noqa: E402 (scripts/ is not a package of the repository)

# A fenced block: its opening fence (``` or more, indented inside a list item or not), its language, its body.
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<lang>[\w+-]*)[^\n]*\n"
                   r"(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(*langs: str) -> list[Block]:
    found = []
    for path in markdown_files():
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group("lang").lower() in langs:
                found.append(Block(path, text.count("\n", 0, match.start()) + 1, match.group("lang").lower(),
                                   textwrap.dedent(match.group("body"))))
    return found


def is_dag_file(code: str) -> bool:
    """A complete DAG file, as in ``dags/``: it imports Airflow's DAG and declares one."""
    return bool(re.search(r"^from airflow\.sdk import .*\bDAG\b", code, re.M)) and "with DAG(" in code \
        and "..." not in code


def test_the_site_builds_strictly(tmp_path):
    """`make docs`' build: any warning (a broken link, a missing anchor, a docstring griffe cannot match, a page
    left out of nav) fails it."""
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    # The generated references are there, from the code.
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert all(f"airflow eo {name}" in cli for name in docs_site.eo_parsers())
    failpoints = (tmp_path / "site" / "reference" / "failpoints" / "index.html").read_text()
    assert "after_commit_point" in failpoints and "before_table_commit" in failpoints
    operator = (tmp_path / "site" / "reference" / "operator" / "index.html").read_text()
    assert "idle_partition_timeout" in operator and ":class:" not in operator


def test_every_python_sample_parses():
    samples = blocks("python", "py")
    assert len(samples) > 20, "the docs' Python samples were not found"
    broken = []
    for block in samples:
        try:
            ast.parse(block.code, filename=block.where())
        except SyntaxError as exc:
            broken.append(f"{block.where()} (+{exc.lineno}): {exc.msg}")
    assert not broken, "Python samples that do not parse:\n" + "\n".join(broken)


def test_every_json_sample_is_json():
    samples = blocks("json")
    assert samples, "the docs' JSON samples were not found"
    broken = []
    for block in samples:
        try:
            json.loads(block.code)
        except json.JSONDecodeError as exc:
            broken.append(f"{block.where()} (+{exc.lineno}): {exc.msg}")
    assert not broken, "JSON samples that do not parse:\n" + "\n".join(broken)


def test_every_complete_dag_sample_builds_its_dag(tmp_path):
    """A sample written as a whole DAG file runs as the DAG processor would run it: the operator's parse-time
    checks (sink x mode x options) pass and a DAG comes out."""
    from airflow.dag_processing.dagbag import DagBag

    samples = [block for block in blocks("python", "py") if is_dag_file(block.code)]
    assert {block.path.name for block in samples} >= {"README.md", "tutorial.md"}
    failed = []
    for n, block in enumerate(samples):  # one folder each: two samples may show the same DAG id
        folder = tmp_path / str(n)
        folder.mkdir()
        (folder / "sample.py").write_text(block.code)
        bag = DagBag(dag_folder=str(folder))
        if bag.import_errors or not bag.dags:
            failed.append(f"{block.where()}: {bag.import_errors or 'no DAG declared'}")
    assert not failed, "DAG samples that do not build:\n" + "\n".join(failed)


def eo_command_lines() -> list[tuple[Block, str]]:
    """Each ``airflow eo ...`` command in a bash or shell block (continuation lines joined), and in a block without
    a language the lines typed at a ``$`` prompt (a terminal session shown with its output)."""
    found = []
    for block in blocks("bash", "shell", "sh", "console", ""):
        for line in block.code.replace("\\\n", " ").splitlines():
            if block.lang == "" and not line.startswith("$ "):
                continue  # output, not a command
            command = re.search(r"\bairflow eo\b.*", line.removeprefix("$ "))
            if command:
                found.append((block, command.group(0)))
    return found


def test_every_airflow_eo_line_names_a_real_subcommand_and_options():
    parsers = docs_site.eo_parsers()
    lines = eo_command_lines()
    assert len(lines) >= 2, "no `airflow eo` line found in the docs' shell blocks"
    wrong = []
    for block, line in lines:
        words = shlex.split(re.split(r"\s(?:\||&&|;|>)\s", line)[0], comments=True)
        sub = words[2] if len(words) > 2 else ""
        if sub not in parsers:
            wrong.append(f"{block.where()}: `{line}`: no subcommand {sub!r} (known: {', '.join(parsers)})")
            continue
        known = {flag for action in parsers[sub]._actions for flag in action.option_strings}
        wrong += [f"{block.where()}: `{line}`: airflow eo {sub} has no option {word}"
                  for word in words[3:] if word.startswith("-") and word.split("=")[0] not in known]
    assert not wrong, "\n".join(wrong)


def test_every_airflow_eo_command_in_the_text_exists():
    """The commands named in running text and tables (`airflow eo status|recover`, `airflow eo rewind PIPELINE
    --to-earliest\\|--to-latest ...`): each subcommand, and each option spelled out, exists."""
    parsers = docs_site.eo_parsers()
    spans = [(path, span) for path in markdown_files()
             for span in re.findall(r"`airflow eo ([^`]+)`", FENCE.sub("", path.read_text()))]
    assert len(spans) >= 20, "the docs' `airflow eo ...` mentions were not found"
    wrong = []
    for path, span in spans:
        words = span.replace("\\|", " ").split()
        if words[0] == "...":
            continue
        for sub in words[0].split("|"):
            if sub not in parsers:
                wrong.append(f"{path.relative_to(REPO)}: `airflow eo {span}`: no subcommand {sub!r}")
                continue
            known = {flag for action in parsers[sub]._actions for flag in action.option_strings}
            wrong += [f"{path.relative_to(REPO)}: `airflow eo {span}`: airflow eo {sub} has no option {flag}"
                      for flag in re.findall(r"(?<![\w-])--?[a-z][\w-]*", " ".join(words[1:])) if flag not in known]
    assert not wrong, "\n".join(wrong)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_readme_is_short_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "README.md is for a newcomer's first two screens: move the rest to docs/"
    links = re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text))
    assert len(links) >= 10, "the README links to the site's pages"
    broken = []
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # https://..., mailto:
        target, _, anchor = link.partition("#")
        path = (REPO / target) if target else README
        if not path.exists():
            broken.append(f"{link}: no file {path.relative_to(REPO)}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(REPO)}")
    assert not broken, "README.md links that lead nowhere:\n" + "\n".join(broken)


@pytest.mark.parametrize("line, expected", [("## The Kafka sink: who produces, and what a reader sees",
                                             "the-kafka-sink-who-produces-and-what-a-reader-sees"),
                                            ("## `airflow eo verify`", "airflow-eo-verify")])
def test_github_anchor(line, expected):
    assert github_anchor(line.lstrip("# ")) == expected
