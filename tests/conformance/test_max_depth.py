"""A queue's depth limit (``configure_queue(q, max_depth=N)``) on both backends: a
submit that would leave more than N tasks queued (queue mode) raises QueueFull,
carrying the queue, the depth and the limit, and writes nothing; exact under
producers in separate processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

import conveyor
from conveyor import InvalidArgument, QueueFull, Status
from conveyor.store.base import TaskStore

HERE = Path(__file__).parent


async def _queued(store: TaskStore, queue: str) -> int:
    reports = await store.stats(queue)
    return reports[0].counts["queued"] if reports else 0


async def test_a_submit_beyond_the_limit_raises_and_writes_nothing(store: TaskStore) -> None:
    await store.configure_queue("q", max_depth=3)
    assert (await store.get_queue("q"))["max_depth"] == 3
    await store.submit("t", queue="q")
    await store.submit("t", queue="q", delay=3600)  # a delayed task is queued too
    with pytest.raises(QueueFull) as refused:
        await store.submit_many([{"name": "t", "queue": "q"}] * 2)
    assert (refused.value.queue, refused.value.depth, refused.value.limit) == ("q", 2, 3)
    assert refused.value.code == "queue_full" and "max_depth 3" in str(refused.value)
    assert await _queued(store, "q") == 2
    await store.submit("t", queue="q")
    for kind in (
        {},
        {"key": "k"},
        {"key": "k2", "conflict": "reject"},
        {"key": "k3", "conflict": "replace"},
        {"partition": "p"},
        {"parent": (await store.list(queue="q")).items[0].id},
        {"partition": "p", "key": "k4"},
    ):
        with pytest.raises(QueueFull):
            await store.submit("t", queue="q", **kind)  # type: ignore[arg-type]
    assert await _queued(store, "q") == 3
    assert await store.get_by_key("k") is None  # no key left behind either


async def test_a_batch_is_all_or_nothing_across_queues(store: TaskStore) -> None:
    await store.configure_queue("small", max_depth=2)
    batch = [{"name": "t", "queue": "free"}] * 400 + [{"name": "t", "queue": "small"}] * 3
    with pytest.raises(QueueFull, match="'small'"):
        await store.submit_many(batch)  # large enough to go in runs
    assert await store.stats() == []
    made = await store.submit_many(batch[:-1])
    assert len(made) == 402 and await _queued(store, "small") == 2


async def test_claiming_makes_room_and_zero_clears_the_limit(store: TaskStore) -> None:
    await store.configure_queue("q", max_depth=1)
    await store.submit("t", queue="q")
    with pytest.raises(QueueFull):
        await store.submit("t", queue="q")
    [held] = await store.claim("q", worker_id="w")  # running is not queued
    await store.submit("t", queue="q")
    await store.succeed(held.id, worker_id="w")
    await store.configure_queue("q", max_depth=0)
    assert (await store.get_queue("q"))["max_depth"] is None
    await store.submit_many([{"name": "t", "queue": "q"}] * 5)
    assert await _queued(store, "q") == 6


async def test_another_store_that_saw_the_queue_unlimited_is_refused(store_url: str) -> None:
    async with conveyor.connect(store_url) as one, conveyor.connect(store_url) as two:
        await two.submit("t", queue="q")  # two has submitted there with no limit
        await one.configure_queue("q", max_depth=1)
        for kind in ({}, {"partition": "p"}, {"key": "k"}):
            with pytest.raises(QueueFull):
                await two.submit("t", queue="q", **kind)  # type: ignore[arg-type]
        with pytest.raises(QueueFull):
            await two.submit_many([{"name": "t", "queue": "q"}] * 300)
        await one.configure_queue("q", max_depth=0)
        await two.submit("t", queue="q")  # the limit gone: accepted again
        assert await _queued(two, "q") == 2


async def test_a_submit_in_the_callers_transaction_is_refused_and_writes_nothing(
    store: TaskStore, store_url: str
) -> None:
    from tests.app.test_transactional import caller_url

    await store.configure_queue("q", max_depth=1)
    await store.submit("t", queue="q")
    engine = create_async_engine(caller_url(store_url))
    try:
        async with engine.connect() as conn:
            await conn.begin()
            for kind in ({}, {"partition": "p"}):
                with pytest.raises(QueueFull):
                    await store.submit("t", queue="q", connection=conn, **kind)  # type: ignore[arg-type]
            # The caller's transaction is still usable: a task to another queue.
            other = await store.submit("t", queue="other", connection=conn)
            await conn.commit()
    finally:
        await engine.dispose()
    assert (await store.get(other.id)) is not None
    assert await _queued(store, "q") == 1


async def test_dead_letters_are_never_refused(store: TaskStore) -> None:
    await store.configure_queue("dead", max_depth=1)
    await store.configure_queue("work", dead_letter="dead")
    await store.submit("t", queue="dead")  # the dead-letter queue is full
    first, second = await store.submit_many([{"name": "t", "queue": "work", "max_attempts": 1}] * 2)
    for _ in range(2):
        [held] = await store.claim("work", worker_id="w")
        await store.fail(held.id, worker_id="w", error="boom")
    assert [t.status for t in [await store.get(first.id), await store.get(second.id)]] == [
        Status.FAILED,
        Status.FAILED,
    ]
    assert await _queued(store, "dead") == 3  # the failures recorded all the same


async def test_bad_settings_are_refused(store: TaskStore) -> None:
    for bad in (-1, 1.5, "10", True):
        with pytest.raises(InvalidArgument, match="max_depth"):
            await store.configure_queue("q", max_depth=bad)  # type: ignore[arg-type]
    await store.configure_queue("bus", queue_mode=False)
    with pytest.raises(InvalidArgument, match="groups only"):
        await store.configure_queue("bus", max_depth=10)
    await store.configure_queue("q", max_depth=10)
    with pytest.raises(InvalidArgument, match="max_depth"):
        await store.configure_queue("q", queue_mode=False)
    assert (await store.get_queue("q"))["queue_mode"] is True
    assert (await store.get_queue("bus"))["max_depth"] is None


async def test_a_task_functions_submit_raises_the_same(app: conveyor.App) -> None:
    @app.task(queue="limited")
    async def job(n: int) -> None:
        pass

    await app.store.configure_queue("limited", max_depth=1)
    await job.submit(1)
    with pytest.raises(QueueFull):
        await job.submit(2)


def test_producers_in_separate_processes_never_overshoot(store_url: str) -> None:
    """Four processes race to submit 30 tasks each into a queue capped at 50 (some
    keyed, some partitioned): exactly 50 are accepted and queued, 70 refused."""
    with conveyor.connect_sync(store_url) as store:
        store.configure_queue("capped", max_depth=50)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_depth_producer.py"), store_url, f"p{n}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    totals = [0, 0]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        accepted, refused = map(int, out.split())
        totals[0] += accepted
        totals[1] += refused
    assert totals == [50, 70]
    with conveyor.connect_sync(store_url) as store:
        assert store.stats("capped")[0].counts["queued"] == 50


async def test_the_limit_is_shown_with_the_settings(store: TaskStore) -> None:
    await store.configure_queue("q", max_depth=7)
    assert [s["max_depth"] for s in await store.queue_settings()] == [7]
