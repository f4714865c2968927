"""``make demo`` tells a run that did not end as planned (it failed, or died before its planned fault fired) apart
from an exactly-once difference: such a run is reported with its output and the demo ends NOT CHECKED."""

from __future__ import annotations

import importlib.util
import signal
import sys
import types
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_demo() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("eo_demo", REPO / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_a_killed_run_counts_as_planned_only_when_its_own_fault_fired(tmp_path):
    demo = load_demo()
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    killed = types.SimpleNamespace(returncode=-signal.SIGKILL)
    run = demo.Run("page_views_xa", when, "during_write", killed, 0.0, str(tmp_path))
    assert run.unplanned() == "was SIGKILLed, but not by its planned fault during_write"
    (tmp_path / "fired.log").write_text("1.000 after_plan: kill pid 9 (itself), run by pid 9\n")
    assert run.unplanned() == "was SIGKILLed, but not by its planned fault during_write"
    (tmp_path / "fired.log").write_text("1.000 during_write: kill(driver) pid 9, run by pid 12\n")
    assert run.unplanned() is None

    failed = demo.Run("page_views_xa", when, "during_write", types.SimpleNamespace(returncode=1), 0.0, str(tmp_path))
    assert failed.unplanned() == "ended (exit 1) before its planned fault during_write fired"
    plain = demo.Run("page_view_events_upsert", when, None, types.SimpleNamespace(returncode=1), 0.0, None)
    assert plain.unplanned() == "failed (exit 1)"
    assert demo.Run("page_view_events_upsert", when, None, types.SimpleNamespace(returncode=0), 0.0,
                    None).unplanned() is None
