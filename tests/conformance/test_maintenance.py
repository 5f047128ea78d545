"""maintain(): lease recovery, eviction and retention, on both backends.

Time is moved with ``store.clock_offset`` (the store's clock, not the test's sleep).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

import pytest
from sqlalchemy import text

import conveyor
from conveyor import Status
from conveyor.store.base import TaskStore
from conveyor.store.protocol import upkeep

DAY = 86_400.0


async def _finish(store: TaskStore, queue: str, n: int, *, group: str | None = None) -> list[str]:
    ids = []
    while len(ids) < n:
        batch = await store.claim(queue, worker_id="w", limit=100, group=group)
        assert batch, "expected claimable tasks"
        # One commit per batch: a commit per task made the 2,000-task test below
        # wait on 2,000 WAL flushes, past its time limit when the disk was busy.
        done = await store.succeed_many(
            [{"task_id": task.id, "worker_id": "w", "group": group} for task in batch]
        )
        assert all(isinstance(t, conveyor.Task) for t in done), done
        ids.extend(task.id for task in batch)
    return ids


async def test_nothing_is_deleted_by_default(store: TaskStore) -> None:
    tasks = await store.submit_many([{"name": "t", "queue": "q", "key": f"k{i}"} for i in range(5)])
    await _finish(store, "q", 5)
    store.clock_offset = 3650 * DAY
    counts = await store.maintain()
    assert counts["deleted"] == 0
    for task in tasks:
        assert (await store.get(task.id)) is not None
    assert (await store.get_by_key("k0")) is not None


async def test_retention_deletes_finished_tasks_with_their_state_and_keys(
    store: TaskStore,
) -> None:
    await store.configure_queue("q", retention=60)
    done = await store.submit_many([{"name": "t", "queue": "q", "key": f"k{i}"} for i in range(3)])
    await _finish(store, "q", 3)
    waiting = await store.submit("t", queue="q", key="still-queued")
    other = await store.submit("t", queue="other")
    other_claim = await store.claim("other", worker_id="w")
    await store.succeed(other_claim[0].id, worker_id="w")

    store.clock_offset = 30
    assert (await store.maintain())["deleted"] == 0  # not old enough yet
    store.clock_offset = 61
    counts = await store.maintain()
    assert counts["deleted"] == 3
    for task in done:
        assert await store.get(task.id) is None
    assert await store.get_by_key("k0") is None
    assert (await store.get(waiting.id)) is not None  # not terminal: kept
    assert (await store.get(other.id)) is not None  # queue without retention: kept
    assert (await store.get_by_key("still-queued")) is not None


async def test_retention_waits_for_the_slowest_group(store: TaskStore) -> None:
    await store.configure_queue("events", retention=10)
    await store.subscribe("events", "fast")
    await store.subscribe("events", "slow")
    task = await store.submit("e", queue="events")
    await _finish(store, "events", 1)
    await _finish(store, "events", 1, group="fast")
    store.clock_offset = 100
    assert (await store.maintain())["deleted"] == 0
    assert (await store.get(task.id, group="slow")).status is Status.QUEUED  # type: ignore[union-attr]
    store.clock_offset = 0
    await _finish(store, "events", 1, group="slow")
    store.clock_offset = 100
    assert (await store.maintain())["deleted"] == 1
    assert await store.get(task.id) is None


async def test_group_only_queue_lets_go_of_queue_mode_state(store: TaskStore) -> None:
    await store.configure_queue("bus", retention=10, queue_mode=False)
    await store.subscribe("bus", "g")
    task = await store.submit("e", queue="bus")
    await _finish(store, "bus", 1, group="g")
    store.clock_offset = 100
    assert (await store.maintain())["deleted"] == 1
    assert await store.get(task.id) is None
    assert (await store.get_queue("bus"))["queue_mode"] is False


async def test_retention_purges_in_bounded_batches(
    store: TaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep, "PURGE_BATCH", 40)
    sizes: list[int] = []
    original = upkeep.purge_batch

    async def spy(st: Any, conn: Any, **kw: Any) -> tuple[int, tuple[int, int]]:
        out = await original(st, conn, **kw)
        sizes.append(out[0])
        return out

    monkeypatch.setattr(upkeep, "purge_batch", spy)
    await store.configure_queue("q", retention=1)
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(150)])
    await _finish(store, "q", 150)
    store.clock_offset = 5
    assert (await store.maintain())["deleted"] == 150
    assert max(sizes) <= 40 and len([n for n in sizes if n > 0]) >= 4
    assert (await store.list(queue="q")).items == []


async def test_eviction_of_tasks_never_claimed(store: TaskStore) -> None:
    await store.configure_queue("q", max_wait=30)
    await store.subscribe("q", "g")
    stale = await store.submit("t", queue="q")
    claimed = await store.submit("t", queue="q")
    [got] = await store.claim("q", worker_id="w", limit=1)
    assert got.id == stale.id
    await store.fail(got.id, worker_id="w", error="boom", delay=0)  # queued again, attempt 1
    store.clock_offset = 31
    counts = await store.maintain()
    # queue mode: `claimed` was never claimed; `stale` was (attempt 1) so it stays.
    # group g: both were never claimed by g.
    assert counts["evicted"] == 3
    assert (await store.get(claimed.id)).status is Status.EVICTED  # type: ignore[union-attr]
    assert (await store.get(stale.id)).status is Status.QUEUED  # type: ignore[union-attr]
    assert (await store.get(stale.id, group="g")).status is Status.EVICTED  # type: ignore[union-attr]
    assert not await store.claim("q", worker_id="w", group="g")
    back = await store.retry(claimed.id)
    assert back is not None and back.status is Status.QUEUED
    history = await store.maintenance_history()
    assert history[0]["evicted"] == 3


async def test_evicted_head_lets_the_stream_move_on(store: TaskStore) -> None:
    await store.configure_queue("q", max_wait=10)
    head = await store.submit("t", queue="q", partition="p")
    store.clock_offset = 11
    later = await store.submit("t", queue="q", partition="p")
    assert (await store.maintain())["evicted"] == 1
    [got] = await store.claim("q", worker_id="w")
    assert got.id == later.id
    assert (await store.get(head.id)).status is Status.EVICTED  # type: ignore[union-attr]


async def test_maintain_recovers_expired_leases(store: TaskStore) -> None:
    a = await store.submit("t", queue="q", max_attempts=1)
    b = await store.submit("t", queue="q", max_attempts=2)
    await store.claim("q", worker_id="w", limit=2, lease=5)
    store.clock_offset = 6
    counts = await store.maintain()
    assert (counts["recovered"], counts["expired"]) == (1, 1)
    failed = await store.get(a.id)
    assert failed is not None and failed.status is Status.FAILED
    assert failed.error is not None and failed.error["code"] == "lease_expired"
    assert (await store.get(b.id)).status is Status.QUEUED  # type: ignore[union-attr]


async def test_concurrent_maintain_does_the_work_once(store: TaskStore, store_url: str) -> None:
    await store.configure_queue("q", retention=1)
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(60)])
    await _finish(store, "q", 60)
    others = [conveyor.connect(store_url) for _ in range(3)]
    try:
        for st in [store, *others]:
            st.clock_offset = 5
        results = await asyncio.gather(
            *(st.maintain() for st in [store, *others] for _ in range(2))
        )
    finally:
        for st in others:
            await st.close()
    assert sum(r["deleted"] for r in results) == 60
    assert (await store.list(queue="q")).items == []


_PASS_SCRIPT = """
import asyncio, sys
import conveyor
from conveyor.store.protocol import upkeep

upkeep.PURGE_BATCH = 25  # many short transactions: the kill lands between two of them

async def main() -> None:
    async with conveyor.connect(sys.argv[1]) as store:
        store.clock_offset = 5
        await store.maintain()

asyncio.run(main())
"""


async def _remaining(store: TaskStore, queue: str) -> int:
    count, cursor = 0, None
    while True:
        page = await store.list(queue=queue, limit=1000, cursor=cursor)
        count += len(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return count


async def test_a_pass_killed_midway_keeps_an_exact_history(
    store: TaskStore, store_url: str, tmp_path: Any
) -> None:
    # A worker stopping (or killed) during maintain() used to leave the tasks its
    # committed purge batches deleted out of the history: the row was written at
    # the end of the pass. Now every step counts itself in its own transaction.
    n = 2000
    await store.configure_queue("q", retention=1)
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(n)])
    first = (await _finish(store, "q", n))[0]
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _PASS_SCRIPT, store_url)
    try:
        deadline = time.monotonic() + 60
        while await store.get(first) is not None:  # purged first: it finished first
            assert proc.returncode is None, "the pass ended before it was seen deleting"
            assert time.monotonic() < deadline, "the pass never deleted anything"
            await asyncio.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        await proc.wait()
    deleted = n - await _remaining(store, "q")
    assert 0 < deleted < n, "the kill should land inside the pass"
    history = await store.maintenance_history(limit=10)
    assert sum(h["deleted"] for h in history) == deleted
    # The next pass finishes the job and the history still adds up.
    store.clock_offset = 5
    assert (await store.maintain())["deleted"] == n - deleted
    history = await store.maintenance_history(limit=10)
    assert sum(h["deleted"] for h in history) == n
    assert history[0]["duration"] > 0


async def _orphans(store: TaskStore) -> int:
    """Delivery rows whose task row is gone (no foreign key deletes them: the
    store must)."""

    async def work(conn: Any) -> int:
        found = await conn.execute(
            text(
                "SELECT count(*) FROM conveyor_deliveries AS d WHERE NOT EXISTS "
                "(SELECT 1 FROM conveyor_tasks AS t WHERE t.seq = d.task_seq)"
            )
        )
        return int(found.scalar())

    return int(await store._run(work))


async def test_retention_leaves_no_delivery_row_without_its_task(store: TaskStore) -> None:
    await store.configure_queue("q", retention=10)
    await store.configure_queue("bus", retention=10, queue_mode=False)
    await store.subscribe("q", "g")
    await store.subscribe("bus", "g")
    await store.submit_many([{"name": "t", "queue": "q"} for _ in range(30)])
    await store.submit_many(
        [{"name": "t", "queue": "q", "partition": f"p{n % 3}"} for n in range(9)]
    )
    await store.submit_many([{"name": "e", "queue": "bus", "key": f"k{n}"} for n in range(10)])
    await _finish(store, "q", 39)
    await _finish(store, "q", 39, group="g")
    await _finish(store, "bus", 10, group="g")
    store.clock_offset = 100
    assert (await store.maintain())["deleted"] == 49
    assert await _orphans(store) == 0
    assert (await store.list(queue="q")).items == []
    # A group subscribed after the purge backfills nothing from deleted tasks.
    await store.subscribe("q", "late")
    assert await _orphans(store) == 0
    assert await store.claim("q", worker_id="w", group="late") == []


async def test_a_pass_ends_while_tasks_keep_finishing(store: TaskStore) -> None:
    """The rollup folds what had finished when it began and leaves the rest to the
    next pass. It used to fold until a batch came back empty, so under a steady
    stream of completions a pass chased them for as long as the stream lasted
    (holding the maintenance lock, and a worker's CPU, the whole time)."""
    stop = asyncio.Event()
    finished = 0

    async def stream() -> None:
        nonlocal finished
        while not stop.is_set():
            await store.submit("t", queue="busy")
            for task in await store.claim("busy", worker_id="w"):
                await store.succeed(task.id, worker_id="w")
                finished += 1

    job = asyncio.create_task(stream())
    try:
        while finished < 20:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await asyncio.wait_for(store.maintain(), timeout=30)
        took = time.monotonic() - started
        assert not job.done(), "the stream stopped on its own"
        assert took < 5, f"the pass took {took:.1f} s"
    finally:
        stop.set()
        await job
