"""The short setting of a script of scripts/ (a benchmark or a measurement) run as a child, its JSON read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_short(script: str, out: Path, timeout: float = 300) -> tuple[Any, str]:
    """``scripts/<script> --short --json <out>``: what it wrote to ``out`` and what it printed; it must succeed."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--short", "--json", str(out)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout
