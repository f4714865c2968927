"""What ``airflow eo`` prints of data it does not control, and whom it records in the audit log."""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import re

import pytest

from airflow_eo.cli.commands import _show
from airflow_eo.hooks.operations import local_actor

# A dead letter's bytes as a hostile producer would send them: OSC 52 (write the clipboard), a C1 CSI that clears
# the screen, DEL, a right-to-left override.
HOSTILE = "k\x1b]52;c;aGk=\x07\x9b2J\x7f\u202eZ"
RAW_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize("output", ["table", "plain", "json", "yaml"])
def test_no_control_character_of_a_record_reaches_the_terminal(output):
    letters = [{"topic": HOSTILE, "partition": 0, "offset": 7, "key": HOSTILE, "value": HOSTILE, "error": HOSTILE}]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _show(output, letters, [(f"dead letters of {HOSTILE}", letters)], [f"a note naming {HOSTILE}"])
    text = printed.getvalue()
    assert not RAW_CONTROLS.findall(text), [hex(ord(c)) for c in RAW_CONTROLS.findall(text)]
    if output in ("table", "plain"):  # shown, escaped, not dropped: the operator sees what the record held
        assert "\\x1b]52;c;aGk=\\x07" in text and "\\x9b" in text and "\\u202e" in text


def test_the_audit_actor_is_the_real_users_name_whatever_the_environment_says(monkeypatch):
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    monkeypatch.delenv("SUDO_USER", raising=False)
    real = pwd.getpwuid(os.getuid()).pw_name
    assert local_actor().split("@")[0] == real
    monkeypatch.setenv("SUDO_USER", "alice")
    assert local_actor().split("@")[0] == f"{real} (sudo from alice)"


@pytest.mark.parametrize(("findings", "unchecked", "code"), [([], [], None), ([], ["runs: not at hand"], 2),
                                                             (["a finding"], ["runs: not at hand"], 1)])
def test_verify_exits_1_with_findings_2_when_only_a_check_could_not_run(findings, unchecked, code, capsys):
    from types import SimpleNamespace

    from airflow_eo.cli.commands import verify

    report = SimpleNamespace(findings=findings, checked=["tiling: 1 committed batches"], unchecked=unchecked)
    ops = SimpleNamespace(verify=lambda pipeline_id: report)
    args = SimpleNamespace(all=False, pipeline_id="p", output="plain")
    undecorated = verify.__wrapped__  # type: ignore[attr-defined]  # the command without its connections
    while hasattr(undecorated, "__wrapped__"):
        undecorated = undecorated.__wrapped__
    if code is None:
        undecorated(args, ops)
        return
    with pytest.raises(SystemExit) as exited:
        undecorated(args, ops)
    # SystemExit("message") exits with code 1 whatever the message: the code itself must be the number.
    assert (exited.value.code if isinstance(exited.value.code, int) else 1) == code
    assert "not checked: runs: not at hand" in capsys.readouterr().out
