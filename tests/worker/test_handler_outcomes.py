"""What a handler's outcome becomes: every exception it raises (at call time or
while running) is recorded with its traceback; ``Permanent``, ``retry_on`` /
``no_retry_on`` and snoozing (SPEC §5)."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest

import conveyor
from _support import running
from conveyor import Status
from conveyor.worker import Context


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


async def test_permanent_fails_for_good_on_the_first_attempt(app: conveyor.App) -> None:
    @app.task(name="gives_up", queue="q", max_attempts=5, backoff=0.01)
    def gives_up(ctx: Context, customer: str) -> None:
        raise conveyor.Permanent(f"no such customer {customer}")

    async with running(app.worker("q", poll_interval=0.05)):
        task = await gives_up.submit("c-7")
        done = await app.store.wait(task.id, timeout=10)
    assert done.status is Status.FAILED and done.attempt == 1
    assert done.error is not None
    assert done.error["type"] == "Permanent" and done.error["code"] == "permanent"
    assert done.error["retryable"] is False
    assert done.error["message"] == "no such customer c-7"
    assert "in gives_up" in done.error["traceback"]


async def test_retry_on_and_no_retry_on_choose_what_is_retried(app: conveyor.App) -> None:
    @app.task(
        name="only_network", queue="q", max_attempts=3, backoff=0.01, retry_on=ConnectionError
    )
    async def only_network(ctx: Context, kind: str) -> str:
        if ctx.task.attempt == 1:
            raise ConnectionError("reset") if kind == "net" else ValueError("bad row")
        return "ok"

    @app.task(name="not_lookups", queue="q", max_attempts=3, backoff=0.01, no_retry_on=(KeyError,))
    async def not_lookups(ctx: Context, kind: str) -> str:
        if ctx.task.attempt == 1:
            raise KeyError("id") if kind == "key" else RuntimeError("flaky")
        return "ok"

    async with running(app.worker("q", poll_interval=0.05)):
        tasks = [
            await only_network.submit("net"),
            await only_network.submit("value"),
            await not_lookups.submit("key"),
            await not_lookups.submit("other"),
        ]
        done = [await app.store.wait(t.id, timeout=10) for t in tasks]
    assert [(t.status, t.attempt) for t in done] == [
        (Status.SUCCEEDED, 2),
        (Status.FAILED, 1),
        (Status.FAILED, 1),
        (Status.SUCCEEDED, 2),
    ]
    assert done[1].error is not None and done[1].error["retryable"] is False
    assert done[1].error["type"] == "ValueError"
    assert done[2].error is not None and done[2].error["type"] == "KeyError"


def test_retry_on_must_name_exception_classes(store_url: str) -> None:
    app = conveyor.App(store_url)
    with pytest.raises(conveyor.InvalidArgument) as caught:
        app.task(retry_on=("ConnectionError",))  # type: ignore[arg-type]
    assert caught.value.field == "retry_on"
    with pytest.raises(conveyor.InvalidArgument) as caught:
        app.task(no_retry_on=42)  # type: ignore[arg-type]
    assert caught.value.field == "no_retry_on"


@pytest.mark.parametrize("how", ["raise", "return"])
async def test_a_handler_snoozes_without_spending_attempts(app: conveyor.App, how: str) -> None:
    runs: list[float] = []

    @app.task(name="wait_for_report", queue="q", max_attempts=1)
    async def wait_for_report(ctx: Context, report: str) -> str | conveyor.Snooze:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) < 3:
            if how == "raise":
                raise conveyor.Snooze(0.2)
            return conveyor.Snooze(timedelta(seconds=0.2))
        return f"{report} ready"

    async with running(app.worker("q", poll_interval=0.05)):
        task = await wait_for_report.submit("r-1")
        done = await app.store.wait(task.id, timeout=15)
    # One attempt allowed, three runs: the two snoozes did not count.
    assert done.status is Status.SUCCEEDED and done.result == "r-1 ready"
    assert (done.attempt, done.max_attempts) == (3, 3)
    assert done.error is None
    assert all(b - a >= 0.15 for a, b in itertools.pairwise(runs))


def test_snooze_needs_a_duration() -> None:
    with pytest.raises(conveyor.InvalidArgument) as caught:
        conveyor.Snooze(-1)
    assert caught.value.field == "delay"
