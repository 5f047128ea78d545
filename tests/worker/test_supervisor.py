"""``conveyor worker APP --processes N``: a supervisor over N real worker
processes. A child killed mid-run is restarted and its task recovered; SIGTERM
stops every child and the supervisor exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from conveyor import Status

APP_SOURCE = '''
import asyncio, os
import conveyor

app = conveyor.App()


@app.task(name="chunk", queue="sup")
async def chunk(ctx, n):
    """Slow on the first attempt only, so a recovered task finishes quickly."""
    if ctx.task.attempt == 1:
        await asyncio.sleep(0.5)
    return {"n": n, "pid": os.getpid()}
'''

STARTED = re.compile(r"worker process (\d+) started: pid (\d+)")


@pytest.fixture
def supervisor(tmp_path: Path, store_url: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    (tmp_path / "supapp.py").write_text(APP_SOURCE)
    log = tmp_path / "supervisor.log"
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_URL"}
    command = [
        *(sys.executable, "-m", "conveyor.cli", "worker", "supapp:app", "--processes", "2"),
        *("--queues", "sup", "--concurrency", "2", "--lease", "2", "--poll-interval", "0.1"),
        *("--grace", "10", "--url", store_url),
    ]
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=sink)
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for _, pid in started(log):  # never leave a worker behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def started(log: Path) -> list[tuple[int, int]]:
    """``(slot, pid)`` of every child start the supervisor logged, in order."""
    return [(int(s), int(p)) for s, p in STARTED.findall(log.read_text())]


def until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_killed_mid_run_is_restarted_and_nothing_is_lost(
    supervisor: tuple[subprocess.Popen[bytes], Path], store_url: str
) -> None:
    proc, log = supervisor
    until(lambda: len(started(log)) >= 2, 60, "two worker processes")
    children = dict(started(log))
    assert sorted(children) == [0, 1]
    with conveyor.connect_sync(store_url) as store:
        tasks = [store.submit("chunk", {"n": i}, queue="sup") for i in range(12)]
        victim = children[0]

        def victim_is_running_a_task() -> bool:
            page = store.list(queue="sup", status="running", limit=50)
            return any(f":{victim}:" in (t.worker_id or "") for t in page.items)

        until(victim_is_running_a_task, 60, "the first child to run a task")
        os.kill(victim, signal.SIGKILL)

        until(lambda: 0 in dict(started(log)[2:]), 60, "the killed child's restart")
        replacement = dict(started(log)[2:])[0]
        assert replacement != victim and alive(replacement)
        assert "exited unexpectedly" in log.read_text()

        done = [store.wait(t.id, timeout=60) for t in tasks]
    assert [t.status for t in done] == [Status.SUCCEEDED] * len(tasks), log.read_text()
    # The killed child's task was recovered once its lease ran out, and rerun.
    assert any(t.attempt >= 2 for t in done)
    assert {t.result["n"] for t in done if t.result} == set(range(12))

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()
    text = log.read_text()
    assert "all worker processes stopped" in text
    assert "Traceback" not in text
    assert not any(alive(pid) for _, pid in started(log))


def test_sigterm_before_any_work_stops_every_child_and_exits_0(
    supervisor: tuple[subprocess.Popen[bytes], Path],
) -> None:
    proc, log = supervisor
    until(lambda: len(started(log)) >= 2, 60, "two worker processes")
    pids = [pid for _, pid in started(log)]
    until(lambda: log.read_text().count("started: queues sup") >= 2, 60, "both workers up")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()
    assert not any(alive(pid) for pid in pids)
    assert len(started(log)) == 2  # nothing was restarted on the way down
