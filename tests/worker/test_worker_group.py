"""A worker's consumer group must be subscribed: a worker never registers a group on
its own (a misspelt name would replay the whole history) unless told where the new
group starts with ``subscribe=``."""

from __future__ import annotations

import asyncio

import pytest

import conveyor
from _support import running
from conveyor import InvalidArgument, NotFound, Status
from conveyor.worker import Context


async def test_a_worker_refuses_a_group_that_is_not_subscribed(app: conveyor.App) -> None:
    ran: list[int] = []

    @app.task(queue="bus")
    async def event(ctx: Context, n: int) -> None:
        ran.append(n)

    await app.store.subscribe("bus", "billing")
    old = [await event.submit(n) for n in range(3)]
    worker = app.worker("bus", group="biling", poll_interval=0.05, maintain_interval=None)
    with pytest.raises(NotFound) as refused:
        await asyncio.wait_for(worker.run(), 10)
    message = str(refused.value)
    assert "group 'biling' on queue 'bus' not found" in message
    assert "'billing'" in message and "subscribe" in message
    assert ran == []
    assert [g.name for g in await app.store.groups("bus")] == ["billing"]
    assert await app.store.get(old[0].id, group="biling") is None
    # The same worker told where the group starts subscribes it and runs from there.
    fresh = app.worker(
        "bus", group="biling", subscribe="new", poll_interval=0.05, maintain_interval=None
    )
    async with running(fresh):
        while len(await app.store.groups("bus")) < 2:  # until the worker has subscribed it
            await asyncio.sleep(0.02)
        new = await event.submit(9)
        done = await app.store.wait(new.id, group="biling", timeout=10)
    assert done.status is Status.SUCCEEDED
    assert ran == [9]  # only what was submitted after it subscribed
    assert sorted(g.name for g in await app.store.groups("bus")) == ["biling", "billing"]


async def test_subscribe_all_replays_and_bad_arguments_are_refused(app: conveyor.App) -> None:
    ran: list[int] = []

    @app.task(queue="bus")
    async def event(ctx: Context, n: int) -> None:
        ran.append(n)

    handles = [await event.submit(n) for n in range(3)]
    worker = app.worker("bus", group="audit", subscribe="all", poll_interval=0.05)
    async with running(worker):
        while not await app.store.groups("bus"):  # until the worker has subscribed it
            await asyncio.sleep(0.02)
        for handle in handles:
            await app.store.wait(handle.id, group="audit", timeout=10)
    assert sorted(ran) == [0, 1, 2]
    with pytest.raises(InvalidArgument, match="subscribe"):
        app.worker("bus", subscribe="all")  # no group
    with pytest.raises(InvalidArgument, match="subscribe"):
        app.worker("bus", group="g", subscribe="everything")  # type: ignore[arg-type]


async def test_an_unsubscribed_group_is_not_brought_back(app: conveyor.App) -> None:
    @app.task(queue="bus")
    async def event(ctx: Context) -> None:
        pass

    await app.store.subscribe("bus", "retired")
    await app.store.unsubscribe("bus", "retired")
    await event.submit()
    worker = app.worker("bus", group="retired", subscribe="all", poll_interval=0.05)
    with pytest.raises(NotFound, match="unsubscribed"):
        await asyncio.wait_for(worker.run(), 10)
    [group] = await app.store.groups("bus")
    assert not group.active
