"""Pause and resume (``store.pause``, ``store.resume``) on both backends: while a
queue, or one group of it, is paused, submits are accepted and claims lease
nothing; resume lets the same work be claimed, and wakes idle workers of every
process."""

from __future__ import annotations

import asyncio

import pytest

import conveyor
from _support import idle_waits
from conveyor import InvalidArgument, NotFound, Status
from conveyor.store.base import TaskStore
from conveyor.worker import Context

POLL = 20.0  # a poll interval the worker test never waits out


async def _fill(store: TaskStore, queue: str) -> list[conveyor.Task]:
    return [
        await store.submit("t", queue=queue),
        await store.submit("t", queue=queue, partition="p"),
        *await store.submit_many([{"name": "t", "queue": queue, "partition": "r"}] * 2),
    ]


async def test_a_paused_queue_accepts_submits_and_leases_nothing(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    assert await store.pause("q") is True
    assert await store.pause("q") is False  # already paused
    made = await _fill(store, "q")
    assert all(t.status is Status.QUEUED for t in made)
    for group in (None, "g"):
        assert await store.claim("q", worker_id="w", limit=10, group=group) == []
        assert await store.claim("q", worker_id="w", limit=10, group=group, partition="p") == []
        assert await store.claim("q", worker_id="w", limit=10, group=group, per_stream=5) == []
    # A claim of several queues passes over the paused one only.
    other = await store.submit("t", queue="other")
    got = await store.claim(["q", "other"], worker_id="w", limit=10)
    assert [t.id for t in got] == [other.id]
    assert await store.resume("q") is True
    assert await store.resume("q") is False
    taken = await store.claim("q", worker_id="w", limit=10, per_stream=5)
    assert {t.id for t in taken} == {t.id for t in made}
    group_taken = await store.claim("q", worker_id="w", limit=10, group="g", per_stream=5)
    assert {t.id for t in group_taken} == {t.id for t in made}


async def test_pausing_a_group_leaves_queue_mode_and_other_groups_alone(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    await store.subscribe("q", "h")
    made = await _fill(store, "q")
    assert await store.pause("q", group="g") is True
    assert await store.claim("q", worker_id="w", limit=10, group="g", per_stream=5) == []
    for group in (None, "h"):
        got = await store.claim("q", worker_id="w", limit=10, group=group, per_stream=5)
        assert {t.id for t in got} == {t.id for t in made}
    # The whole queue's pause and the group's are separate: lifting one keeps the other.
    await store.pause("q")
    assert await store.resume("q", group="g") is True
    assert await store.claim("q", worker_id="w", limit=10, group="g") == []
    assert await store.resume("q") is True
    got = await store.claim("q", worker_id="w", limit=10, group="g", per_stream=5)
    assert {t.id for t in got} == {t.id for t in made}


async def test_running_tasks_finish_and_streams_stay_in_order(store: TaskStore) -> None:
    first, second = await store.submit_many([{"name": "t", "queue": "q", "partition": "p"}] * 2)
    (leased,) = await store.claim("q", worker_id="w")
    assert leased.id == first.id
    await store.pause("q")
    # A lease taken before the pause is the holder's to finish.
    await store.succeed(leased.id, worker_id="w", result=1)
    assert await store.claim("q", worker_id="w") == []
    await store.resume("q")
    (after,) = await store.claim("q", worker_id="w")
    assert after.id == second.id


async def test_pause_state_is_shown_by_stats_get_queue_and_groups(store: TaskStore) -> None:
    await store.subscribe("q", "g")
    await store.subscribe("q", "h")
    await store.submit("t", queue="q")
    await store.pause("q", group="g")
    (report,) = await store.stats("q")
    assert report.paused is False
    assert report.groups["g"].paused is True and report.groups["h"].paused is False
    assert report.as_dict()["groups"]["g"]["paused"] is True
    assert (await store.get_queue("q"))["paused"] is False
    assert {x.name: x.paused for x in await store.groups("q")} == {"g": True, "h": False}
    await store.pause("q")
    (report,) = await store.stats("q")
    assert report.paused is True and report.as_dict()["paused"] is True
    assert all(x.paused for x in report.groups.values())
    assert (await store.get_queue("q"))["paused"] is True
    assert all(x.paused for x in await store.groups("q"))
    # A paused queue with nothing in it is still reported.
    await store.pause("empty")
    assert [r.paused for r in await store.stats("empty")] == [True]


async def test_bad_input_is_refused_and_writes_nothing(store: TaskStore) -> None:
    with pytest.raises(InvalidArgument, match="queue"):
        await store.pause("")
    with pytest.raises(InvalidArgument, match="group"):
        await store.pause("q", group="")
    with pytest.raises(NotFound, match="group 'nobody'"):
        await store.pause("q", group="nobody")
    with pytest.raises(NotFound, match="group 'nobody'"):
        await store.resume("q", group="nobody")
    await store.subscribe("q", "g")
    await store.unsubscribe("q", "g")
    with pytest.raises(NotFound):
        await store.pause("q", group="g")
    assert (await store.get_queue("q"))["paused"] is False
    assert await store.stats("q") == [] or not (await store.stats("q"))[0].paused


async def test_a_pause_holds_for_every_store(store_url: str) -> None:
    async with conveyor.connect(store_url) as one, conveyor.connect(store_url) as two:
        await one.subscribe("q", "g")
        made = await _fill(one, "q")
        # One has claimed before the pause: nothing it remembers lets a claim through.
        assert await one.claim("other", worker_id="w") == []
        await two.pause("q")
        assert await one.claim("q", worker_id="w", limit=10, per_stream=5) == []
        assert await one.claim("q", worker_id="w", limit=10, group="g", per_stream=5) == []
        await one.resume("q")
        got = await two.claim("q", worker_id="w", limit=10, per_stream=5)
        assert {t.id for t in got} == {t.id for t in made}


async def test_resume_from_another_store_wakes_an_idle_worker(
    app: conveyor.App, store_url: str
) -> None:
    ran: list[int] = []

    @app.task(queue="pq")
    async def job(ctx: Context, n: int) -> None:
        ran.append(n)

    await app.store.pause("pq")
    handles = [await job.submit(n) for n in range(5)]
    worker = app.worker("pq", concurrency=2, poll_interval=POLL, maintain_interval=None)
    with idle_waits(app.store) as waits:
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(waits.idle.wait(), 10)  # idle, the queue paused
            await asyncio.sleep(0.5)
            assert ran == []
            async with conveyor.connect(store_url) as other:
                assert await other.resume("pq") is True
            last = await app.store.wait(handles[-1].id, timeout=POLL)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 15)
    assert last.status is Status.SUCCEEDED and sorted(ran) == list(range(5))
    assert False not in waits, f"the worker found the work by polling: idle waits ended {waits}"
