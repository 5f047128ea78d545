"""``conveyor demo`` runs end to end on a throwaway SQLite file, through App,
@app.task and real workers, and tells one task's story."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def test_demo_runs_and_checks_ordering(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    env["COLUMNS"] = "120"
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "demo", "--tasks", "60"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ordering checked" in out and "✓" in out
    assert "tasks/s" in out
    for mode in ("queue mode", "group analytics", "group audit", "partitioned"):
        assert mode in out
    # One task's full story, in order.
    story = out[out.index("one task's story") :]
    steps = [
        "submitted to demo.jobs",
        "claimed by worker-",
        "progress 20% downloading",
        "fails: ConnectionError",
        "attempt 2 (its retry was due at",
        "succeeded on attempt 2",
        "every consumer is done: the workers stop",  # the success is told when it happens
    ]
    positions = [story.index(step) for step in steps]
    assert positions == sorted(positions), story
    # The story's zero is a time of day; its times only grow.
    assert re.search(r"since it was submitted at \d\d:\d\d:\d\d\.\d{3} UTC\)", story), story
    times = [float(t) for t in re.findall(r"^\s+(\d+\.\d\d)  ", story, re.MULTILINE)]
    assert len(times) >= len(steps) and times == sorted(times), story
    assert "thumbnail" in story  # the result
    # The bars and the table list the consumers in the same order.
    bars = re.findall(r"^(.+?): (demo\.\w+)\s+━", out, re.MULTILINE)
    table = re.findall(
        r"^\s+(queue mode|group \w+|partitioned, 2 workers)\s+(demo\.\w+)\s", out, re.M
    )
    assert bars and [(b.strip(), q) for b, q in bars] == table
    assert "database: sqlite:///" in out and "deleted" in out
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing left behind in the working directory


def test_the_demo_is_an_app_with_task_functions() -> None:
    from conveyor import App
    from conveyor.demo import Plan, Tour, build_app

    names = {q: f"demo.{q}" for q in ("jobs", "events", "orders")}
    app = build_app("sqlite:///unused.db", Tour(plan=Plan.split(60), names=names))
    assert isinstance(app, App)
    assert sorted(app.tasks) == ["demo.event", "demo.order_step", "demo.resize"]
