"""``conveyor demo`` runs end to end on a throwaway SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_demo_runs_and_checks_ordering(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "demo", "--tasks", "60"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ordering checked" in out and "✓" in out
    assert "tasks/s" in out
    for mode in ("queue mode", "group analytics", "group audit", "partitioned"):
        assert mode in out
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left behind in the working directory
