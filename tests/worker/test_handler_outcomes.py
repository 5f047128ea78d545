"""What a handler's outcome becomes: every exception it raises (at call time or
while running) is recorded with its traceback; ``Permanent``, ``retry_on`` /
``no_retry_on`` and snoozing (SPEC §5)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import conveyor
from conveyor import Status
from conveyor.worker import Context, Worker


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[conveyor.App]:
    application = conveyor.App(store_url)
    try:
        yield application
    finally:
        await application.close()


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    job = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(job, 15)


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
async def test_a_handler_called_with_wrong_arguments_fails_with_its_traceback(
    app: conveyor.App, is_async: bool
) -> None:
    if is_async:

        @app.task(name="needs_args", queue="q", max_attempts=1)
        async def needs_args(ctx: Context, to: str, subject: str) -> None:
            return None
    else:

        @app.task(name="needs_args", queue="q", max_attempts=1)
        def needs_args(ctx: Context, to: str, subject: str) -> None:
            return None

    async with running(app.worker("q", poll_interval=0.05, lease=30)):
        missing = await needs_args.submit(to="a")  # type: ignore[call-arg]
        # A CLI payload of '"hello"' calls the handler with one positional argument.
        scalar = await app.store.submit("needs_args", "hello", queue="q", max_attempts=1)
        # Well within the 30 s lease: the failure is recorded, not left to expire.
        done = [await app.store.wait(t.id, timeout=10) for t in (missing, scalar)]
    for task in done:
        assert task.status is Status.FAILED
        assert task.error is not None
        assert task.error["type"] == "TypeError", task.error
        assert "subject" in task.error["message"]
        assert task.error["traceback"]
