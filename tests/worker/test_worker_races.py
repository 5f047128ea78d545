"""Workers under the races of a real fleet: several starting together with a new
consumer group, and heartbeats that follow the lease each claim was granted."""

from __future__ import annotations

import asyncio
import time

import conveyor
from conveyor import Status
from conveyor.worker import Context


async def test_workers_starting_together_with_a_new_group(store_url: str) -> None:
    """Four workers (each with its own store), told to subscribe a group nobody
    registered yet, start at the same moment: all of them keep running."""
    apps = [conveyor.App(store_url) for _ in range(4)]
    seen: list[int] = []
    fns = []
    for application in apps:

        @application.task(name="job", queue="q")
        async def job(ctx: Context, n: int) -> None:
            seen.append(n)

        fns.append(job)
    try:
        for n in range(8):
            await fns[0].submit(n)
        workers = [
            application.worker(
                "q", group="g", subscribe="all", poll_interval=0.1, maintain_interval=None
            )
            for application in apps
        ]
        await asyncio.gather(*(application.store.open() for application in apps))
        jobs = [asyncio.create_task(w.run()) for w in workers]
        deadline = time.monotonic() + 30
        while len(seen) < 8 and time.monotonic() < deadline:
            if any(j.done() for j in jobs):
                break
            await asyncio.sleep(0.05)
        crashed = [j for j in jobs if j.done()]
        for w in workers:
            w.stop()
        outcomes = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 20)
        assert crashed == [], outcomes
        assert [o for o in outcomes if o is not None] == []
        assert sorted(seen) == list(range(8))
    finally:
        for application in apps:
            await application.close()


async def test_heartbeat_follows_the_lease_each_claim_got(
    app: conveyor.App, store_url: str
) -> None:
    """The queue's lease changes after the worker started and its maintenance loop
    is off: heartbeats still come every third of the lease the claim was granted,
    so a recoverer elsewhere never takes the task away."""
    runs: list[int] = []

    @app.task(name="slow", queue="hb")
    async def slow(ctx: Context) -> str:
        runs.append(ctx.task.attempt)
        await asyncio.sleep(3.0)
        return "ok"

    worker = app.worker("hb", concurrency=2, poll_interval=0.1, maintain_interval=None)
    job = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(0.5)  # the worker has read the settings: no lease, so 30 s
        await app.store.configure_queue("hb", lease=1.0)
        handle = await slow.submit()
        async with conveyor.connect(store_url) as other:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                await other.recover()  # as another worker's maintenance would
                task = await other.get(handle.id)
                assert task is not None
                if task.terminal:
                    break
                await asyncio.sleep(0.2)
        done = await app.store.wait(handle.id, timeout=20)
    finally:
        worker.stop()
        await asyncio.wait_for(job, 20)
    assert done.status is Status.SUCCEEDED
    assert (done.attempt, runs) == (1, [1])
