"""The documentation site's generated pages (an MkDocs hook, named in mkdocs.yml) and its docstring clean-up.

- ``<!-- generated: cli -->`` in a page becomes the reference of ``airflow eo``: every subcommand's usage, as
  argparse prints it, and its options, built from the command definitions Airflow's CLI loads
  (``airflow_eo/cli/definition.py``), so the page cannot drift from the code.
- ``<!-- generated: failpoints -->`` becomes the table of every failpoint (``airflow_eo/core/failpoints.POINTS``).
- :class:`SphinxRoles`, a griffe extension (mkdocstrings' ``extensions``), shows the docstrings' Sphinx roles
  (``:class:`~airflow_eo.sinks.MySqlXaSink```) as code (``MySqlXaSink``): mkdocstrings renders Markdown, not reST.

tests/docs/ imports this module for the subcommands and options the pages' ``airflow eo`` lines must name.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import griffe

CLI_MARKER = "<!-- generated: cli -->"
FAILPOINTS_MARKER = "<!-- generated: failpoints -->"

# :class:`~a.b.C` -> `C`; :func:`a.b.f` -> `a.b.f`; :data:`X`, :mod:`m`, :meth:, :attr:, :exc: likewise.
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def _role_as_code(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def without_sphinx_roles(text: str) -> str:
    """A docstring's Sphinx roles as Markdown code; reST's double backquotes as single ones."""
    return _ROLE.sub(_role_as_code, text).replace("``", "`")


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring before mkdocstrings parses it (``:param:`` fields are left to the sphinx parser)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = without_sphinx_roles(obj.docstring.value)


def eo_parsers() -> dict[str, argparse.ArgumentParser]:
    """One argparse parser per ``airflow eo`` subcommand, built from the definitions Airflow's CLI registers."""
    from airflow_eo.cli.definition import EO_COMMANDS

    parsers = {}
    for command in EO_COMMANDS:
        parser = argparse.ArgumentParser(prog=f"airflow eo {command.name}", description=command.description,
                                         add_help=True)
        for arg in command.args:
            arg.add_to_parser(parser)
        parsers[command.name] = parser
    return parsers


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def cli_reference() -> str:
    """The Markdown of every ``airflow eo`` subcommand: what it does, its usage, its arguments."""
    from airflow_eo.cli.definition import EO_CLI_COMMANDS, EO_COMMANDS

    group = EO_CLI_COMMANDS[0]
    parsers = eo_parsers()
    out = [f"`airflow {group.name}`: {group.description}", ""]
    for command in EO_COMMANDS:
        parser = parsers[command.name]
        out += [f"## airflow eo {command.name}", "", f"{command.help}.", "", command.description or "", "",
                "```text", parser.format_usage().strip(), "```", "",
                "| argument | default | what |", "| --- | --- | --- |"]
        for action in parser._actions:  # argparse keeps no public list of its arguments
            if isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.dest}`"
            if action.option_strings and action.nargs != 0:
                names += f" `{action.metavar or action.dest.upper()}`"
            default = "" if action.default in (None, False) else f"`{action.default}`"
            out.append(f"| {names} | {default} | {_cell(action.help or '')} |")
        out.append("")
    return "\n".join(out)


def failpoints_reference() -> str:
    """The Markdown table of every failpoint, in protocol order, with the action the crash tests arm it with."""
    from airflow_eo.core.failpoints import POINTS

    rows = ["| point | where | action in the crash tests |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {_cell(point.where)} | {f'`{point.kill}`' if point.kill else '—'} |"
             for name, point in POINTS.items()]
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs hook: fill the generated sections of a page."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if FAILPOINTS_MARKER in markdown:
        markdown = markdown.replace(FAILPOINTS_MARKER, failpoints_reference())
    return markdown
