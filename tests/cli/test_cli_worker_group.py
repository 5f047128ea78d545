"""``conveyor worker --group``: a group that is not subscribed stops the worker at
once with a usage error naming the group and the queue (a misspelt name must not
register a new group that replays the history); ``--subscribe`` creates it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conveyor

APP = """
import conveyor

app = conveyor.App()

@app.task(name="charge", queue="billing")
def charge(ctx, n):
    return n
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "billapp.py").write_text(APP)
    return tmp_path


def worker(app_dir: Path, url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CONVEYOR_URL": url}
    argv = [sys.executable, "-m", "conveyor.cli", "worker", "billapp:app", "-q", "billing"]
    return subprocess.Popen(
        [*argv, "--poll-interval", "0.1", *args],
        cwd=app_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_a_misspelt_group_stops_the_worker(app_dir: Path, store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        store.subscribe("billing", "billing")
        old = store.submit("charge", {"args": [1]}, queue="billing")
    code, err = finished(worker(app_dir, store_url, "--group", "biling"))
    assert code == 2, err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert "group 'biling' on queue 'billing' not found" in line
    assert "groups of 'billing': 'billing'" in line
    assert "--subscribe new" in line and "--subscribe all" in line
    with conveyor.connect_sync(store_url) as store:
        assert [g.name for g in store.groups("billing")] == ["billing"]
        assert store.get(old.id, group="biling") is None
    # Under a supervisor the children are not restarted in a loop: it exits 2 too.
    code, err = finished(worker(app_dir, store_url, "--group", "biling", "--processes", "2"))
    assert code == 2, err
    assert "not restarting" in err and "group 'biling' on queue 'billing'" in err


def test_subscribe_creates_the_group_from_where_it_says(app_dir: Path, store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        old = store.submit("charge", {"args": [1]}, queue="billing")
    proc = worker(app_dir, store_url, "--group", "audit", "--subscribe", "new")
    try:
        with conveyor.connect_sync(store_url) as store:
            deadline = time.monotonic() + 30
            while not store.groups("billing"):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.05)
            new = store.submit("charge", {"args": [2]}, queue="billing")
            done = store.wait(new.id, group="audit", timeout=30)
            assert done.result == 2, (done.status, done.error)
            assert store.get(old.id, group="audit") is None  # "new": not the history
    finally:
        proc.send_signal(signal.SIGTERM)
    code, err = finished(proc)
    assert code == 0, err


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("--subscribe", "new"), "--subscribe needs --group"),
        (("--group", "g", "--subscribe", "everything"), "is not all, new or an ISO 8601 time"),
        (("--group", "g", "--subscribe", "2026-11-01T00:00:00"), "with a time zone"),
    ],
)
def test_bad_subscribe_options(
    app_dir: Path, tmp_path: Path, args: tuple[str, ...], problem: str
) -> None:
    code, err = finished(worker(app_dir, f"sqlite:///{tmp_path / 'x.db'}", *args))
    assert code == 2 and problem in err and "Traceback" not in err, err
