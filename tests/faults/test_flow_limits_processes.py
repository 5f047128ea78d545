"""Flow-control limits hold against claimers in separate processes (separate
stores, each with its own connections): a concurrency-limited and a key-limited
queue claimed hard by several processes while this one samples what runs from the
database, on a SQLite file and on PostgreSQL; and a rate-limited drain by four
processes starts about what the rate allows in its window, where with no limit
they would drain everything."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import conveyor
from conveyor import Rate
from conveyor.store.base import TaskStore

HERE = Path(__file__).parent
CLAIMER = str(HERE / "_flow_claimer.py")


def _start(
    url: str, queue: str, seconds: float, limit: int, hold: float, n: int
) -> tuple[list[subprocess.Popen[str]], float]:
    """``n`` claimer processes, every one connected; and the moment they start."""
    procs = [
        subprocess.Popen(
            [sys.executable, CLAIMER, url, queue, str(seconds), str(limit), str(hold)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    start = time.time() + 0.2
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start}\n")
        proc.stdin.flush()
    return procs, start


def _finish(procs: list[subprocess.Popen[str]]) -> list[int]:
    counts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, "a claimer failed (its error is above)"
        assert proc.returncode == 0
        counts.append(int(out.strip()))
    return counts


async def _sample(store: TaskStore, queue: str, until: float) -> tuple[list[int], list[int]]:
    """Until ``until``: the running tasks of ``queue`` (one snapshot per read), in
    all and per key (the key is the payload)."""
    totals, per_key = [], []
    while time.time() < until:
        page = await store.list(queue=queue, status="running", limit=1000)
        totals.append(len(page.items))
        keys = Counter(t.payload for t in page.items)
        per_key.append(max(keys.values(), default=0))
        await asyncio.sleep(0.005)
    return totals, per_key


@pytest.mark.timeout(180)
async def test_concurrency_and_key_limits_hold_across_processes(store_url: str) -> None:
    async with conveyor.connect(store_url) as store:
        await store.configure_queue("capped", concurrency=3)
        await store.configure_queue("keyed", key_concurrency=2)
        await store.submit_many([{"name": "t", "queue": "capped", "payload": "x"}] * 3000)
        await store.submit_many(
            [
                {"name": "t", "queue": "keyed", "payload": k, "concurrency_key": k}
                for k in (f"k{i % 4}" for i in range(3000))
            ]
        )
        for queue, cap, check in (("capped", 3, 0), ("keyed", 2, 1)):
            procs, start = _start(store_url, queue, 4.0, 3, 0.003, 4)
            samples = await _sample(store, queue, start + 4.0)
            counts = _finish(procs)
            seen = samples[check]
            assert sum(counts) > 20, "the claimers must have raced"
            assert len(seen) > 50 and max(seen) >= 1
            assert [n for n in seen if n > cap] == [], f"{queue}: over the limit {cap}"
            if queue == "keyed":
                assert max(samples[0]) <= 8  # 4 keys x 2


@pytest.mark.timeout(180)
async def test_a_rate_limited_drain_by_four_processes(store_url: str) -> None:
    rate, seconds = 20, 8.0
    async with conveyor.connect(store_url) as store:
        await store.configure_queue("rated", rate=Rate(rate, per=1))
        await store.submit_many([{"name": "t", "queue": "rated"}] * 2000)
        procs, _ = _start(store_url, "rated", seconds, 10, 0.0, 4)
        counts = _finish(procs)
    allowed = rate + rate * seconds  # a burst of one period, then the rate
    assert sum(counts) <= allowed * 1.15, counts
    assert sum(counts) >= allowed * 0.6, counts  # loose: a loaded machine claims late
