"""``conveyor worker --unknown release|fail``: what a worker does with a claimed task
whose name its app has no handler for (by default, hand it back)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from test_cli_worker_group import finished, worker

import conveyor
from conveyor import Status

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


def _claimed_once(store: conveyor.SyncStore, task_id: str) -> conveyor.Task:
    deadline = time.monotonic() + 30
    while True:
        task = store.get(task_id)
        assert task is not None
        if task.attempt >= 1 and task.status is not Status.RUNNING:
            return task
        assert time.monotonic() < deadline, "the worker never claimed it"
        time.sleep(0.05)


@pytest.mark.parametrize("option", [(), ("--unknown", "release")])
def test_release_by_default(app_dir: Path, store_url: str, option: tuple[str, ...]) -> None:
    with conveyor.connect_sync(store_url) as store:
        task = store.submit("refund", queue="billing")  # no handler in billapp
        proc = worker(app_dir, store_url, *option)
        try:
            after = _claimed_once(store, task.id)
        finally:
            proc.send_signal(signal.SIGTERM)
        code, err = finished(proc)
    assert code == 0, err
    assert after.status is Status.QUEUED and after.error is None
    assert after.max_attempts == task.max_attempts + after.attempt  # no attempt spent
    assert "no handler for task name 'refund'" in err


def test_fail(app_dir: Path, store_url: str) -> None:
    with conveyor.connect_sync(store_url) as store:
        task = store.submit("refund", queue="billing")
        proc = worker(app_dir, store_url, "--unknown", "fail")
        try:
            after = _claimed_once(store, task.id)
        finally:
            proc.send_signal(signal.SIGTERM)
        code, err = finished(proc)
    assert code == 0, err
    assert after.status is Status.FAILED and after.error is not None
    assert after.error["code"] == "unknown_task"


def test_a_bad_value_is_a_usage_error(app_dir: Path, tmp_path: Path) -> None:
    code, err = finished(worker(app_dir, f"sqlite:///{tmp_path / 'x.db'}", "--unknown", "skip"))
    assert code == 2 and "--unknown" in err and "release, fail" in err, err
