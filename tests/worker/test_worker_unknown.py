"""A claimed task whose name the worker's app has no handler for is handed back,
not failed: another app's worker (a rolling deploy, two apps on one queue) must
still be able to run it. No attempt is spent, a growing delay keeps the worker
from spinning on it, and a warning is logged once per name. ``unknown="fail"``
fails it for good instead."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import conveyor
from _support import running
from conveyor import InvalidArgument, Status
from conveyor.store.base import TaskStore
from conveyor.worker import Context


async def _queued_again(store: TaskStore, task_id: str, timeout: float = 10) -> conveyor.Task:
    """The task once it has been claimed and handed back at least once."""
    deadline = time.monotonic() + timeout
    while True:
        task = await store.get(task_id)
        assert task is not None
        if task.attempt >= 1 and task.status is Status.QUEUED:
            return task
        assert task.status in (Status.QUEUED, Status.RUNNING), task
        assert time.monotonic() < deadline, "the worker never claimed the task"
        await asyncio.sleep(0.02)


async def test_a_task_with_no_handler_is_handed_back_for_a_worker_that_knows_it(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="conveyor.worker")
    old = conveyor.App(store_url)  # the fleet before the deploy: no "invoice.send" yet
    new = conveyor.App(store_url)

    @old.task(name="report.build", queue="q")
    async def build(ctx: Context) -> str:
        return "built"

    @new.task(name="invoice.send", queue="q")
    async def send(ctx: Context, n: int) -> int:
        return n

    try:
        tasks = [await send.submit(n) for n in range(2)]
        before = time.monotonic()
        async with running(old.worker("q", poll_interval=0.05, maintain_interval=None)):
            first = await _queued_again(old.store, tasks[0].id)
            second = await _queued_again(old.store, tasks[1].id)
            await asyncio.sleep(1.5)  # long enough for a spinning worker to claim it a lot
            later = await old.store.get(tasks[0].id)
        elapsed = time.monotonic() - before
        for handed_back in (first, second):
            assert handed_back.error is None  # not failed
            # Not counted: the budget grew by the attempt the claim took.
            assert handed_back.max_attempts == tasks[0].max_attempts + handed_back.attempt
            assert handed_back.run_at > handed_back.created_at  # claimable only later
        assert later is not None and later.status is not Status.FAILED
        # 1 s, then 2 s, ...: at most a claim or two in this time, not hundreds.
        assert 1 <= later.attempt <= 2 + int(elapsed // 2), later.attempt
        warnings = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and "no handler" in r.getMessage()
        ]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per name
        assert "'invoice.send'" in warnings[0].getMessage()
        assert "report.build" in warnings[0].getMessage()

        # The new app's worker runs both once their delay is over.
        async with running(new.worker("q", poll_interval=0.05, maintain_interval=None)):
            done = [await new.store.wait(t.id, timeout=30) for t in tasks]
        assert [(t.status, t.result) for t in done] == [
            (Status.SUCCEEDED, 0),
            (Status.SUCCEEDED, 1),
        ]
    finally:
        await old.close()
        await new.close()


async def test_unknown_fail_fails_it_for_good(app: conveyor.App) -> None:
    worker = app.worker("q", poll_interval=0.05, unknown="fail")
    async with running(worker):
        task = await app.store.submit("nobody.knows", {"x": 1}, queue="q", max_attempts=5)
        done = await app.store.wait(task.id, timeout=10)
    assert done.status is Status.FAILED and done.attempt == 1
    assert done.error is not None
    assert done.error["code"] == "unknown_task" and done.error["retryable"] is False
    assert "nobody.knows" in done.error["message"]
    with pytest.raises(InvalidArgument, match="unknown"):
        app.worker("q", unknown="skip")  # type: ignore[arg-type]


async def test_an_unknown_head_holds_its_stream(app: conveyor.App) -> None:
    """In a partition, the next task must not overtake a head handed back."""
    ran: list[int] = []

    @app.task(name="known", queue="q")
    async def known(ctx: Context, n: int) -> None:
        ran.append(n)

    head = await app.store.submit("unknown.step", queue="q", partition="p")
    await known.with_options(partition="p").submit(1)
    async with running(app.worker("q", poll_interval=0.05, maintain_interval=None)):
        await _queued_again(app.store, head.id)
        await asyncio.sleep(0.3)
    assert ran == []  # held behind its head
