"""Workers as real processes: SIGTERM winds down cleanly, kill -9 loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import Status, Task
from conveyor.store.base import TaskStore

APP_SOURCE = '''
import asyncio, os, pathlib
import conveyor

app = conveyor.App(os.environ["CONVEYOR_URL"])


@app.task(name="sleepy", queue="procs")
async def sleepy(ctx, seconds, tag):
    """Slow on its first attempt only, so a recovered task finishes quickly."""
    if ctx.task.attempt == 1:
        await asyncio.sleep(seconds)
    return {"tag": tag, "pid": os.getpid()}
'''


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "procapp.py").write_text(APP_SOURCE)
    return tmp_path


@pytest.fixture
def spawn(app_dir: Path, store_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started worker processes; any still alive at the end are killed."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_worker(
    procs: list[subprocess.Popen[bytes]],
    app_dir: Path,
    url: str,
    *,
    lease: float = 30,
    grace: float = 30,
    concurrency: int = 2,
) -> subprocess.Popen[bytes]:
    code = (
        "from conveyor.app import load_app; "
        f"load_app('procapp:app').run_worker(['procs'], concurrency={concurrency}, "
        f"lease={lease}, grace={grace}, poll_interval=0.1)"
    )
    env = {
        **os.environ,
        "CONVEYOR_URL": url,
        "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")]),
    }
    log = app_dir / f"worker-{len(procs)}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=sink)
    procs.append(proc)
    return proc


def stderr_of(app_dir: Path, index: int) -> str:
    return (app_dir / f"worker-{index}.log").read_text()


async def until_running(store: TaskStore, *tasks: Task, timeout: float = 20) -> list[Task]:
    deadline = time.monotonic() + timeout
    while True:
        now = [await store.get(t.id) for t in tasks]
        if all(t is not None and t.status is Status.RUNNING for t in now):
            return [t for t in now if t is not None]
        assert time.monotonic() < deadline, f"not running: {now}"
        await asyncio.sleep(0.05)


async def test_sigterm_finishes_in_flight_work_and_hands_back_the_rest(
    store: TaskStore, app_dir: Path, store_url: str, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # The grace period is long beside `quick`'s 0.4 s, so a loaded machine still
    # finishes it in time. The grace period is real time (the worker's own clock):
    # `took` is held only to its lower bound, which no slow machine can fail; that
    # the worker did not wait for `stuck` (60 s) shows in `stuck` handed back below
    # (the process wait's timeout only guards against a hang).
    grace = 4.0
    proc = start_worker(spawn, app_dir, store_url, grace=grace)
    quick = await store.submit("sleepy", {"args": [0.4, "quick"]}, queue="procs", priority=1)
    stuck = await store.submit("sleepy", {"args": [60, "stuck"]}, queue="procs")
    await until_running(store, quick, stuck)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, grace + 30)
    took = time.monotonic() - began
    stderr = stderr_of(app_dir, 0)
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert took > grace - 0.3  # waited out the grace for `stuck`, then exited
    done = await store.get(quick.id)
    assert done is not None and done.status is Status.SUCCEEDED
    assert done.result == {"tag": "quick", "pid": proc.pid}
    back = await store.get(stuck.id)
    assert back is not None
    # Handed back at no cost: the attempt number stays, the budget grows by one.
    assert (back.status, back.attempt, back.worker_id) == (Status.QUEUED, 1, None)
    assert back.max_attempts == stuck.max_attempts + 1
    [again] = await store.claim("procs", worker_id="successor")  # claimable at once
    assert again.id == stuck.id and again.attempt == 2


async def test_kill_9_tasks_are_recovered_after_the_lease(
    store: TaskStore, app_dir: Path, store_url: str, spawn: list[subprocess.Popen[bytes]]
) -> None:
    victim = start_worker(spawn, app_dir, store_url, lease=1.0)
    tasks = [await store.submit("sleepy", {"args": [60, f"t{i}"]}, queue="procs") for i in range(2)]
    held = await until_running(store, *tasks)
    assert {t.worker_id for t in held} == {held[0].worker_id}
    # Start the heir now: it finds nothing to claim while the victim heartbeats.
    heir = start_worker(spawn, app_dir, store_url, lease=1.0)
    victim.kill()  # SIGKILL: no hand-back, the leases just stop being renewed
    await asyncio.to_thread(victim.wait, 10)
    orphaned = [await store.get(t.id) for t in tasks]
    done = [await store.wait(t.id, timeout=20) for t in tasks]
    for before, after in zip(orphaned, done, strict=True):
        assert before is not None and before.status is Status.RUNNING
        assert before.lease_expires_at is not None
        assert after.status is Status.SUCCEEDED and after.attempt == 2
        assert after.result["pid"] == heir.pid
        # Taken over only once the dead worker's lease had run out.
        assert after.finished_at is not None and after.finished_at > before.lease_expires_at
    heir.send_signal(signal.SIGINT)  # an idle worker stops at once, with exit code 0
    assert await asyncio.to_thread(heir.wait, 10) == 0
