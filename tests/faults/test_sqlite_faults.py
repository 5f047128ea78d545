"""SQLite under pressure: four processes on one file with kill -9 among them, and a
full disk (SPEC §3.1, §3.6)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _faultkit import Figures, read_jsonl, spawn, stop_all

import conveyor

HAMMERS = 4
HAMMER_S = 12.0
KILLS = 4


def _integrity(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def _statuses(url: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with conveyor.connect_sync(url) as store:
        cursor = None
        while True:
            page = store.list(queue="hammer", limit=1000, cursor=cursor)
            out.update({t.id: t.status.value for t in page.items})
            cursor = page.next_cursor
            if cursor is None:
                return out


@pytest.mark.timeout(240)
def test_four_processes_and_kill_9_mid_transaction(tmp_path: Path) -> None:
    path = tmp_path / "hammer.db"
    url = f"sqlite:///{path}"
    with conveyor.connect_sync(url):
        pass
    figures = Figures(
        scenario="sqlite_4_processes_kill_9",
        injected=f"{HAMMERS} processes on one file, kill -9 of {KILLS} of them mid-write",
    )
    rng = random.Random(7)
    began = time.monotonic()
    alive: dict[str, subprocess.Popen[str]] = {}
    finished: list[subprocess.Popen[str]] = []
    counter = 0

    def start() -> None:
        nonlocal counter
        name = f"h{counter}"
        counter += 1
        left = max(4.0, HAMMER_S - (time.monotonic() - began))
        proc = spawn("hammer", url, tmp_path, name, left, logdir=tmp_path, log=f"{name}.log")
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", (tmp_path / f"{name}.log").read_text()
        alive[name] = proc

    kills = 0
    integrity_during = []
    try:
        for _ in range(HAMMERS):
            start()
        began = time.monotonic()  # the clock runs from when all four are at work
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 1.5))
            victim = rng.choice(sorted(alive))
            proc = alive.pop(victim)
            proc.kill()  # SIGKILL: mid-transaction more often than not (they write nonstop)
            proc.wait()
            finished.append(proc)
            kills += 1
            integrity_during.append(_integrity(path))
            start()
        summaries = {}
        for name, proc in alive.items():
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, (tmp_path / f"{name}.log").read_text()
            summaries[name] = json.loads(out.strip().splitlines()[-1])
    finally:
        stop_all([*alive.values(), *finished], timeout=0)
    errors: dict[str, int] = {}
    for summary in summaries.values():
        for error, n in summary["errors"].items():
            errors[error] = errors.get(error, 0) + n
    logs = "".join(p.read_text() for p in tmp_path.glob("h*.log"))
    ops = [op for p in tmp_path.glob("ops-*.jsonl") for op in read_jsonl(p)]
    acked = {op["id"] for op in ops if op["op"] == "submit"}
    acked_done = {op["id"] for op in ops if op["op"] == "done"}
    # What the dead left leased comes back when its lease runs out: finish it.
    with conveyor.connect_sync(url) as store:
        deadline = time.monotonic() + 60
        while True:
            got = store.claim("hammer", worker_id="drain", lease=30, limit=200)
            for task in got:
                store.succeed(task.id, worker_id="drain", attempt=task.attempt)
            [stats] = store.stats("hammer")
            if stats.counts.get("queued", 0) + stats.counts.get("running", 0) == 0:
                break
            assert time.monotonic() < deadline, stats
            if not got:
                time.sleep(0.2)
    statuses = _statuses(url)
    figures.tasks = len(statuses)
    figures.processed = sum(1 for s in statuses.values() if s == "succeeded")
    figures.lost = len(acked - statuses.keys()) + sum(
        1 for i in acked_done if statuses.get(i) != "succeeded"
    )
    figures.extra = {
        "processes_killed": kills,
        "acknowledged_submits": len(acked),
        "acknowledged_successes": len(acked_done),
        "errors_reaching_callers": errors,
        "integrity_check": _integrity(path),
        "integrity_during": sorted(set(integrity_during)),
    }
    figures.show()
    assert kills == KILLS
    assert figures.lost == 0
    assert figures.processed == figures.tasks >= len(acked)
    assert not [e for e in errors if "locked" in e or "busy" in e], errors
    assert not [e for e in errors if e != "LostLease"], errors
    assert "locked" not in logs and "Traceback" not in logs, logs[-2000:]
    assert figures.extra["integrity_check"] == "ok"
    assert integrity_during == ["ok"] * kills


# ------------------------------------------------------------------ full disk
@contextlib.contextmanager
def _small_filesystem(size_kib: int) -> Iterator[Path]:
    """A size-capped tmpfs (needs mount rights: root in most CI containers)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a size-capped file system needs root")
    folder = Path(tempfile.mkdtemp(prefix="conveyor-full-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _capped_pages(path: Path, pages: int) -> dict[str, Any]:
    """Engine options that give every connection a ``max_page_count``."""
    import sqlite3

    def creator() -> Any:
        conn = sqlite3.connect(str(path), check_same_thread=False)
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    return {"engine_options": {"creator": creator}}


async def _fill(url: str, options: dict[str, Any]) -> tuple[list[str], conveyor.StoreUnavailable]:
    """Submit until the store refuses; the ids it acknowledged and the error."""
    acked: list[str] = []
    async with conveyor.connect(url, **options) as store:
        for i in range(100_000):
            try:
                task = await store.submit("fill", {"pad": "x" * 4000, "i": i}, key=f"fill-{i}")
            except conveyor.StoreUnavailable as exc:
                # The refused submit left nothing behind, and reads still work.
                assert await store.get_by_key(f"fill-{i}") is None
                assert acked and await store.get(acked[-1]) is not None
                return acked, exc
            acked.append(task.id)
    raise AssertionError("the disk never filled up")


async def _check_after(url: str, acked: list[str]) -> None:
    async with conveyor.connect(url) as store:
        stats = await store.stats("default")
        assert sum(stats[0].counts.values()) == len(acked)
        for task_id in acked[:: max(1, len(acked) // 50)] + acked[-1:]:
            assert await store.get(task_id) is not None
        await store.submit("after", {"ok": True}, queue="after")  # writes work again


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["max_page_count", "tmpfs"])
def test_disk_full(tmp_path: Path, how: str) -> None:
    figures = Figures(scenario=f"sqlite_disk_full_{how}", injected=f"full disk ({how})")
    with contextlib.ExitStack() as stack:
        if how == "tmpfs":
            folder = stack.enter_context(_small_filesystem(2048))
        else:
            folder = tmp_path
        path = folder / "full.db"
        url = f"sqlite:///{path}"
        with conveyor.connect_sync(url):
            pass
        options: dict[str, Any] = {}
        if how == "max_page_count":
            with contextlib.closing(sqlite3.connect(path)) as conn:
                pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
            options = _capped_pages(path, pages + 300)
        acked, error = asyncio.run(_fill(url, options))
        message = str(error)
        if how == "tmpfs":  # make room: the same file system, grown
            subprocess.run(
                ["mount", "-o", "remount,size=16m", str(folder)], check=True, capture_output=True
            )
        asyncio.run(_check_after(url, acked))
        figures.tasks = len(acked)
        figures.lost = 0
        figures.extra = {"error": message, "integrity_check": _integrity(path)}
        figures.show()
        assert "full" in message and "free disk space" in message, message
        assert figures.extra["integrity_check"] == "ok"
