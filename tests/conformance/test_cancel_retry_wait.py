"""cancel, retry, wait (SPEC §2.1)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

import conveyor
from conveyor import LostLease, NotFound, Status, TaskCancelled
from conveyor.store.base import TaskStore

UNKNOWN = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


# -------------------------------------------------------------------- cancel
async def test_cancel_queued(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    cancelled = await store.cancel(task.id)
    assert cancelled is not None
    assert cancelled.id == task.id
    assert cancelled.status is Status.CANCELLED and cancelled.terminal
    assert cancelled.finished_at is not None
    assert await store.get(task.id) == cancelled
    assert await store.claim("q", worker_id="w") == []


async def test_cancel_delayed_task(store: TaskStore) -> None:
    task = await store.submit("t", queue="q", delay=5)
    await store.cancel(task.id)
    store.clock_offset = 10
    assert await store.claim("q", worker_id="w") == []


async def test_cancel_running_tells_the_holder(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    [held] = await store.claim("q", worker_id="w")
    cancelled = await store.cancel(task.id)
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    assert cancelled.lease_expires_at is None
    for write in (
        store.heartbeat(held.id, worker_id="w"),
        store.progress(held.id, worker_id="w", progress=0.5),
        store.succeed(held.id, worker_id="w", result=1),
        store.fail(held.id, worker_id="w", error="x"),
        store.succeed(held.id, worker_id="w", attempt=held.attempt),
    ):
        with pytest.raises(TaskCancelled) as info:
            await write
        assert isinstance(info.value, LostLease)
        assert info.value.task_id == task.id
    assert await store.get(task.id) == cancelled
    store.clock_offset = 3600  # the lease cannot "expire" it back into the queue
    assert await store.claim("q", worker_id="w2") == []
    assert await store.get(task.id) == cancelled


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
async def test_cancel_terminal_is_unchanged(store: TaskStore, end: str) -> None:
    task = await store.submit("t", queue="q")
    if end == "cancelled":
        finished = await store.cancel(task.id)
    else:
        [held] = await store.claim("q", worker_id="w")
        if end == "succeeded":
            finished = await store.succeed(held.id, worker_id="w", result="r")
        else:
            finished = await store.fail(held.id, worker_id="w", error="e", retryable=False)
    assert finished is not None and finished.status == end
    assert await store.cancel(task.id) == finished
    assert await store.get(task.id) == finished


async def test_cancel_unknown_is_none(store: TaskStore) -> None:
    assert await store.cancel(UNKNOWN) is None
    assert await store.cancel_by_key("no-such-key") is None


async def test_cancel_by_key(store: TaskStore) -> None:
    task = await store.submit("t", key="k")
    other = await store.submit("t")
    cancelled = await store.cancel_by_key("k")
    assert cancelled is not None and cancelled.id == task.id
    assert cancelled.status is Status.CANCELLED
    untouched = await store.get(other.id)
    assert untouched is not None and untouched.status is Status.QUEUED


# --------------------------------------------------------------------- retry
async def test_retry_failed_task(store: TaskStore) -> None:
    task = await store.submit("t", queue="q", max_attempts=1)
    [held] = await store.claim("q", worker_id="w")
    await store.fail(held.id, worker_id="w", error="boom")
    retried = await store.retry(task.id)
    assert retried is not None
    assert retried.status is Status.QUEUED
    assert retried.attempt == 1
    assert retried.finished_at is None and retried.lease_expires_at is None
    [again] = await store.claim("q", worker_id="w")
    assert again.id == task.id and again.attempt == 2
    done = await store.succeed(again.id, worker_id="w", result="second time")
    assert done.status is Status.SUCCEEDED


async def test_retry_with_reset_attempts(store: TaskStore) -> None:
    task = await store.submit("t", queue="q", max_attempts=2)
    for _ in range(2):
        [held] = await store.claim("q", worker_id="w")
        await store.fail(held.id, worker_id="w", error="boom", delay=0)
    failed = await store.get(task.id)
    assert failed is not None and failed.status is Status.FAILED and failed.attempt == 2
    retried = await store.retry(task.id, reset_attempts=True)
    assert retried is not None
    # attempt numbers keep counting (they are the fencing token); the budget grows
    assert retried.status is Status.QUEUED and retried.attempt == 2
    assert retried.max_attempts == 4
    [again] = await store.claim("q", worker_id="w")
    assert again.attempt == 3
    # the full budget is back: the first failure is retried again
    requeued = await store.fail(again.id, worker_id="w", error="once more", delay=0)
    assert requeued.status is Status.QUEUED


async def test_retry_cancelled_task(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    await store.cancel(task.id)
    retried = await store.retry(task.id)
    assert retried is not None and retried.status is Status.QUEUED
    [again] = await store.claim("q", worker_id="w")
    assert again.id == task.id


async def test_retry_of_a_task_that_is_not_finished_or_succeeded_is_unchanged(
    store: TaskStore,
) -> None:
    queued = await store.submit("a", queue="q")
    assert await store.retry(queued.id) == queued
    running = await store.submit("b", queue="r")
    [held] = await store.claim("r", worker_id="w")
    assert await store.retry(running.id) == held
    done = await store.succeed(held.id, worker_id="w", result=1)
    assert await store.retry(running.id) == done
    assert await store.get(running.id) == done


async def test_retry_unknown_is_none(store: TaskStore) -> None:
    assert await store.retry(UNKNOWN) is None
    assert await store.retry_by_key("no-such-key") is None


async def test_retry_by_key(store: TaskStore) -> None:
    task = await store.submit("t", key="k", queue="q")
    await store.cancel_by_key("k")
    retried = await store.retry_by_key("k", reset_attempts=True)
    assert retried is not None and retried.id == task.id
    assert retried.status is Status.QUEUED and retried.attempt == 0
    assert retried.max_attempts == task.max_attempts
    [again] = await store.claim("q", worker_id="w")
    assert again.id == task.id


# ---------------------------------------------------------------------- wait
async def test_wait_returns_a_finished_task_at_once(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    cancelled = await store.cancel(task.id)
    started = time.monotonic()
    assert await store.wait(task.id, timeout=5) == cancelled
    assert await store.wait(task.id) == cancelled
    assert time.monotonic() - started < 0.5


async def test_wait_sees_a_completion(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")

    async def worker() -> None:
        await asyncio.sleep(0.2)
        [held] = await store.claim("q", worker_id="w")
        await store.succeed(held.id, worker_id="w", result={"r": 1})

    done, _ = await asyncio.gather(store.wait(task.id, timeout=5), worker())
    assert done.status is Status.SUCCEEDED and done.result == {"r": 1}


async def test_wait_returns_failed_tasks_too(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    waiter = asyncio.create_task(store.wait(task.id, timeout=5))
    [held] = await store.claim("q", worker_id="w")
    await store.fail(held.id, worker_id="w", error="no", retryable=False)
    done = await waiter
    assert done.status is Status.FAILED


async def test_wait_does_not_return_on_a_retry(store: TaskStore) -> None:
    task = await store.submit("t", queue="q")
    waiter = asyncio.create_task(store.wait(task.id, timeout=0.6))
    [held] = await store.claim("q", worker_id="w")
    await store.fail(held.id, worker_id="w", error="retry me", delay=60)
    with pytest.raises(TimeoutError):
        await waiter


async def test_wait_times_out(store: TaskStore) -> None:
    task = await store.submit("t")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await store.wait(task.id, timeout=0.3)
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 1.5
    with pytest.raises(TimeoutError):
        await store.wait(task.id, timeout=timedelta(milliseconds=100))
    with pytest.raises(TimeoutError):
        await store.wait(task.id, timeout=0)
    current = await store.get(task.id)
    assert current is not None and current.status is Status.QUEUED


async def test_wait_unknown_task(store: TaskStore) -> None:
    with pytest.raises(NotFound):
        await store.wait(UNKNOWN, timeout=1)


async def test_wait_sees_a_completion_by_another_store_within_a_second(
    store: TaskStore, store_url: str
) -> None:
    task = await store.submit("t", queue="q")
    async with conveyor.connect(store_url) as other:
        [held] = await other.claim("q", worker_id="elsewhere")
        waiter = asyncio.create_task(store.wait(task.id, timeout=10))
        await asyncio.sleep(1.2)  # let the waiter settle into its slowest rhythm
        assert not waiter.done()
        finished_at = time.monotonic()
        await other.succeed(held.id, worker_id="elsewhere", result="remote")
        done = await waiter
        latency = time.monotonic() - finished_at
    assert done.status is Status.SUCCEEDED and done.result == "remote"
    assert latency < 1.0
